#!/usr/bin/env bash
# What a visitor of a real R Shiny app waits for, in one run, all in front
# of the same R process: the daemon starts the app (one copy) and that
# copy is measured straight at its own port ("direct"), through HAProxy in
# front of that port, and through shinyctl's load balancer; and faucet
# (its own R process: faucet starts its workers itself) when it is on PATH.
#   - single GETs of / on a new connection each (p50, p99)
#   - a page load: / and every script and stylesheet it names, in order, over
#     one keep-alive connection, as a browser's first connection does
#   - input→output round trips over Shiny's WebSocket
#   - the load event of the app in headless Chromium with its cache off
#   - shinyctl's load balancer's memory with SESSIONS open Shiny sessions
#     (10,000; fewer when the open-files limit cannot hold them: two
#     descriptors each in the load balancer, and R's memory grows ~0.4 MiB
#     a session)
# Every figure is taken in ROUNDS rounds, the targets in turn and a
# different one first in each round (Chromium's loads too), and the median
# of the rounds is printed, then the ratios to direct R.
#
#   bench/shiny.sh
#   ROUNDS=5 GETS=300 SESSIONS=2000 bench/shiny.sh
#   BENCH_SHORT=1 bench/shiny.sh     # one round of a few samples, a debug build
#
# Needs: cargo, R with shiny, haproxy, curl, python3; chromium and
# chromedriver for the browser figure. Uses its own SHINYCTL_HOME and free
# ports; everything it starts is stopped by PID on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/rig.sh

ROUNDS=${ROUNDS:-$(pick 1 3)}
GETS=${GETS:-$(pick 10 150)}
PAGES=${PAGES:-$(pick 2 30)}
TRIPS=${TRIPS:-$(pick 10 200)}
LOADS=${LOADS:-$(pick 1 10)}
SESSIONS=${SESSIONS:-$(pick 50 10000)}

bash scripts/deps.sh haproxy curl >/dev/null
bench_build shiny_client
client=$examples/shiny_client
wait_ok() {
    for _ in $(seq 1 600); do
        curl -fsS -o /dev/null --max-time 2 "http://127.0.0.1:$1/" 2>/dev/null && return 0
        sleep 0.1
    done
    echo "bench/shiny.sh: nothing answers 200 on port $1" >&2
    exit 1
}

# The app: a fluidPage with an input and a text output.
mkdir -p "$tmp/app"
cat >"$tmp/app/app.R" <<'EOF'
library(shiny)
ui <- fluidPage(numericInput("n", "n", 1), textOutput("out"))
server <- function(input, output, session) output$out <- renderText(input$n * 2)
shinyApp(ui, server)
EOF

# The sessions held at the end: two descriptors each in the load balancer,
# one in R and in the client. The daemon, so the load balancer, inherits
# this shell's limit: raised to fit them where the hard limit allows it
# (root may raise that too), and the app's max-connections past them.
need=$((2 * SESSIONS + 1024))
if [ "$(ulimit -Hn)" != unlimited ] && [ "$(ulimit -Hn)" -lt "$need" ]; then
    ulimit -Hn "$need" 2>/dev/null || true
fi
ulimit -n "$(ulimit -Hn)"
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt "$need" ]; then
    fit=$((($(ulimit -n) - 1024) / 2))
    echo "(the open-files limit is $(ulimit -n) and cannot be raised here: $fit sessions, not $SESSIONS)"
    SESSIONS=$fit
fi
files=$((SESSIONS + 1024 > 4096 ? SESSIONS + 1024 : 4096))
shinyctl=$(free_port)
printf 'app-name: benchapp\nport: %s\nhost: 127.0.0.1\nworking-dir: %s\nwarm-replicas: 0\nidle-timeout: 0\nmax-connections: %s\nsandbox:\n  open-files: %s\n' \
    "$shinyctl" "$tmp/app" "$files" "$files" >"$tmp/app.yaml"
bench_apply "$tmp/app.yaml"
wait_copies benchapp 1
direct=$(status_py "j['apps'][0]['copies'][0]['copy_port']")

# HAProxy in front of the same R process (an inserted cookie, as shinyctl does).
haproxy=$(free_port)
cat >"$tmp/haproxy.cfg" <<EOF
defaults
    mode http
    timeout connect 5s
    timeout client 1h
    timeout server 1h
    timeout tunnel 1h
frontend f
    bind 127.0.0.1:$haproxy
    default_backend b
backend b
    cookie SRV insert indirect nocache
    server r 127.0.0.1:$direct cookie r
EOF
setsid haproxy -db -f "$tmp/haproxy.cfg" >"$tmp/haproxy.log" 2>&1 &
pids+=($!)
names=(direct haproxy shinyctl)
ports=("$direct" "$haproxy" "$shinyctl")
if command -v faucet >/dev/null 2>&1; then
    faucet_port=$(free_port)
    (cd "$tmp/app" && exec setsid faucet start --host "127.0.0.1:$faucet_port" --workers 1 >"$tmp/faucet.log" 2>&1) &
    pids+=($!)
    names+=(faucet)
    ports+=("$faucet_port")
fi
for p in "${ports[@]}"; do wait_ok "$p"; done

# Rounds: each measure, each target in turn, the order rotating.
declare -A fig
measures=("gets $GETS" "page $PAGES" "ws $TRIPS")
for round in $(seq 1 "$ROUNDS"); do
    for m in "${measures[@]}"; do
        set -- $m
        for k in "${!names[@]}"; do
            i=$(((k + round) % ${#names[@]}))
            read -r p50 p99 < <("$client" "$1" "${ports[$i]}" "$2")
            fig["$1,${names[$i]},p50"]+="$p50 "
            fig["$1,${names[$i]},p99"]+="$p99 "
        done
    done
done

echo "A Shiny app (fluidPage, numericInput, textOutput), one R process behind every target but faucet;"
echo "median of $ROUNDS alternating rounds, ms; $(nproc) cores, $(basename "$(dirname "$bin")") build"
printf '%-9s %14s %14s %14s %14s %14s %14s\n' target "GET p50" "GET p99" "page p50" "page p99" "ws p50" "ws p99"
for name in "${names[@]}"; do
    row=()
    for m in gets page ws; do
        for q in p50 p99; do row+=("$(median <<<"${fig[$m,$name,$q]}")"); done
    done
    printf '%-9s %14s %14s %14s %14s %14s %14s\n' "$name" "${row[@]}"
done
echo "ratios to direct R (p50):"
for name in "${names[@]}"; do
    [ "$name" = direct ] && continue
    line="$name:"
    for m in gets page ws; do
        d=$(median <<<"${fig[$m,direct,p50]}")
        v=$(median <<<"${fig[$m,$name,p50]}")
        line+=" $m $(awk -v a="$v" -v b="$d" 'BEGIN {printf "%.2f", a / b}')"
    done
    echo "  $line"
done

# The load event in headless Chromium, cache off, every target in turn, a
# different one first each time.
if command -v chromedriver >/dev/null 2>&1 && command -v chromium >/dev/null 2>&1; then
    cd_port=$(free_port)
    # Chromium's temporary folders in the bench's own, which goes with it.
    mkdir -p "$tmp/browser-tmp"
    TMPDIR=$tmp/browser-tmp setsid chromedriver --port="$cd_port" >"$tmp/chromedriver.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 1 100); do curl -fsS "http://127.0.0.1:$cd_port/status" >/dev/null 2>&1 && break; sleep 0.1; done
    wd() { curl -fsS -X "$1" -H 'Content-Type: application/json' "http://127.0.0.1:$cd_port$2" ${3:+-d "$3"}; }
    caps='{"capabilities":{"alwaysMatch":{"browserName":"chrome","goog:chromeOptions":{"binary":"/usr/bin/chromium","args":["--headless=new","--no-sandbox","--disable-gpu","--disable-dev-shm-usage","--user-data-dir='"$tmp"'/profile"]}}}}'
    session=$(wd POST /session "$caps" | python3 -c 'import json,sys; print(json.load(sys.stdin)["value"]["sessionId"])')
    wd POST "/session/$session/goog/cdp/execute" '{"cmd":"Network.enable","params":{}}' >/dev/null
    wd POST "/session/$session/goog/cdp/execute" '{"cmd":"Network.setCacheDisabled","params":{"cacheDisabled":true}}' >/dev/null
    declare -A load
    for n in $(seq 1 "$LOADS"); do
        for k in "${!names[@]}"; do
            i=$(((k + n) % ${#names[@]}))
            wd POST "/session/$session/url" "{\"url\":\"http://127.0.0.1:${ports[$i]}/\"}" >/dev/null
            ms=$(wd POST "/session/$session/execute/sync" '{"script":"var e = performance.getEntriesByType(\"navigation\")[0]; return e.loadEventEnd - e.startTime;","args":[]}' |
                python3 -c 'import json,sys; v = json.load(sys.stdin)["value"]; assert v > 0, v; print(v)')
            load[${names[$i]}]+="$ms "
        done
    done
    wd DELETE "/session/$session" >/dev/null || true
    d=$(median <<<"${load[direct]}")
    line="Chromium load event, cache off, median of $LOADS, ms:"
    for name in "${names[@]}"; do
        v=$(median <<<"${load[$name]}")
        line+=" $name $(awk -v a="$v" 'BEGIN {printf "%.1f", a}')"
        [ "$name" = direct ] || line+=" ($(awk -v a="$v" -v b="$d" 'BEGIN {printf "%.2f", a / b}'))"
    done
    echo "$line"
else
    echo "(Chromium load event skipped: chromium and chromedriver are not both installed)"
fi

# The load balancer's memory with SESSIONS open Shiny sessions.
proxy_pid=$(status_py 'j["proxy_pid"]')
rss() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
before=$(rss "$proxy_pid")
coproc HOLD { "$client" hold "$shinyctl" "$SESSIONS"; }
hold_pid=$HOLD_PID
pids+=("$hold_pid")
read -r opened <&"${HOLD[0]}" || opened=""
[ "$opened" = open ] || { echo "bench/shiny.sh: could not open $SESSIONS sessions" >&2; exit 1; }
during=$(rss "$proxy_pid")
# Every session is the load balancer's (status counts them from its figures).
for _ in $(seq 1 100); do
    held=$(status_py "j['apps'][0]['copies'][0]['sessions']")
    [ "$held" -lt "$SESSIONS" ] || break
    sleep 0.2
done
exec {HOLD[1]}>&-
wait "$hold_pid" 2>/dev/null || true
[ "$held" -ge "$SESSIONS" ] || { echo "bench/shiny.sh: status counts $held sessions of the $SESSIONS open" >&2; exit 1; }
awk -v b="$before" -v d="$during" -v n="$SESSIONS" \
    'BEGIN {printf "shinyctl load balancer RSS: %.1f MiB idle, %.1f MiB with %d open sessions (%.1f KiB each)\n", b/1024, d/1024, n, (d-b)/n}'
