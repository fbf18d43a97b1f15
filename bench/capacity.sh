#!/usr/bin/env bash
# Capacity under load, in one run (README, "Capacity"): Shiny sessions,
# each sending an input every second whose reactive blocks for 200 ms
# (`Sys.sleep`, as a database call does), opened one by one from 1 to
# SESSIONS over RAMP seconds, then all held HOLD seconds more. Input→output
# latency (p50, p95, per 10-second window and overall) and the active copies
# over time, for the same app run two ways, one after the other:
#   fixed:    replicas: 1
#   capacity: replicas: 1, max-replicas: 8, max-sessions: 3
# plus each one's memory at the end (its copies' memory as status shows it, spares
# included) and B, the p95 of one session alone with the same reactive,
# measured first in the same run. The target: p95 under capacity ≤ 2.5 × B.
#
#   bench/capacity.sh                    # 24 sessions, 30 s ramp, 30 s held
#   BENCH_SHORT=1 bench/capacity.sh      # 4 sessions, 5 s + 5 s, a debug build
#
# Needs: cargo, R with shiny, python3. Uses its own SHINYCTL_HOME and free
# ports; everything it starts is stopped by PID on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/rig.sh
SESSIONS=${SESSIONS:-$(pick 4 24)}
RAMP=${RAMP:-$(pick 5 30)}
HOLD=${HOLD:-$(pick 5 30)}
ALONE=${ALONE:-$(pick 3 15)}

bench_build shiny_client
client=$examples/shiny_client

# The app: an input, and an output whose reactive blocks R for 200 ms.
app_r='library(shiny)
ui <- fluidPage(numericInput("n", "n", 1), textOutput("out"))
server <- function(input, output, session) output$out <- renderText({ Sys.sleep(0.2); input$n * 2 })
shinyApp(ui, server)'

# start_app NAME EXTRA: the app as NAME with the manifest lines EXTRA; waits
# for its active copy and its spare; prints its port.
start_app() {
    local name=$1 extra=$2 port
    port=$(free_port)
    mkdir -p "$tmp/$name"
    printf '%s\n' "$app_r" >"$tmp/$name/app.R"
    printf 'app-name: %s\nport: %s\nhost: 127.0.0.1\nidle-timeout: 0\n%b' "$name" "$port" "$extra" >"$tmp/$name/app.yaml"
    bench_apply "$tmp/$name/app.yaml"
    wait_copies "$name" 2
    echo "$port"
}

# active NAME: the app's active copies now.
active() { status_py "[a['capacity']['active'] for a in j['apps'] if a['name'] == '$1'][0]"; }

# memory NAME: the memory of the app's copies as status shows it (MEM), in MiB.
memory() { status_py "round(sum(c['mem_bytes'] or 0 for a in j['apps'] if a['name'] == '$1' for c in a['copies']) / 2**20)"; }

# ramp NAME PORT: the load on the app; its figures in $tmp/NAME.out, its
# active copies each second in $tmp/NAME.copies.
ramp() {
    local name=$1 port=$2 poller
    (while :; do active "$name" 2>/dev/null || echo "?"; sleep 1; done) >"$tmp/$name.copies" &
    poller=$!
    pids+=("$poller")
    RAMP_SECS=$RAMP HOLD_SECS=$HOLD "$client" ramp "$port" "$SESSIONS" >"$tmp/$name.out"
    stop_pid "$poller"
}

fixed_port=$(start_app fixed "replicas: 1\n")
B=$(RAMP_SECS=1 HOLD_SECS=$ALONE "$client" ramp "$fixed_port" 1 | awk '$1 == "all" {print $3}')
ramp fixed "$fixed_port"
fixed_mem=$(memory fixed)
"$bin" stop fixed >/dev/null
cap_port=$(start_app capacity "replicas: 1\nmax-replicas: 8\nmax-sessions: 3\nscale-down-after: 1m\n")
ramp capacity "$cap_port"
cap_mem=$(memory capacity)

echo "$SESSIONS Shiny sessions opened over ${RAMP}s, held ${HOLD}s more; each sends an input a second, its reactive blocks R 200 ms"
echo "B, the p95 of one session alone: $B ms"
echo
printf '%-10s  %-26s  %-26s\n' "" "fixed (replicas: 1)" "capacity (max-replicas: 8)"
printf '%-10s  %-26s  %-26s\n' "window" "p50 / p95 ms (samples)" "p50 / p95 ms (samples)"
paste <(grep -E '^(window|all)' "$tmp/fixed.out") <(grep -E '^(window|all)' "$tmp/capacity.out") | awk -F'\t' '{
    split($1, f, " "); split($2, c, " ");
    label = (f[1] == "all") ? "all" : f[2];
    fp = (f[1] == "all") ? f[2] " / " f[3] " (" f[4] ")" : f[3] " / " f[4] " (" f[5] ")";
    cp = (c[1] == "all") ? c[2] " / " c[3] " (" c[4] ")" : c[3] " / " c[4] " (" c[5] ")";
    printf "%-10s  %-26s  %-26s\n", label, fp, cp }'
every5() { awk 'NR % 5 == 1' "$1" | tr '\n' ' '; }
echo
echo "active copies, every 5 s:"
echo "  fixed:    $(every5 "$tmp/fixed.copies")"
echo "  capacity: $(every5 "$tmp/capacity.copies")"
echo "memory at the end (copies, spares included): fixed ${fixed_mem}M, capacity ${cap_mem}M"
cap_p95=$(awk '$1 == "all" {print $3}' "$tmp/capacity.out")
awk -v p="$cap_p95" -v b="$B" 'BEGIN {
    r = (b > 0) ? p / b : 0;
    printf "capacity p95 / B = %.2f (target: at most 2.5): %s\n", r, (r <= 2.5) ? "met" : "NOT met" }'
