#!/usr/bin/env bash
# What a visitor of a real R Shiny app waits for, straight from R and through
# HAProxy, shinyctl and (when it is on PATH) faucet, in one run:
#   - single GETs of / on a new connection each (p50, p99)
#   - a page load: / and every script and stylesheet it names, in order, over
#     one keep-alive connection, as a browser's first connection does
#   - input→output round trips over Shiny's WebSocket
#   - the load event of the app in headless Chromium with its cache off
#   - shinyctl's load balancer's memory with SESSIONS open Shiny sessions
# Every figure is taken in ROUNDS alternating rounds and the median of the
# rounds is printed, then the ratios to direct R.
#
#   bench/shiny.sh
#   ROUNDS=5 GETS=300 SESSIONS=1000 bench/shiny.sh
#
# Needs: cargo, R with shiny, haproxy, curl; chromium and chromedriver for the
# browser figure. Everything it starts is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-3}
GETS=${GETS:-150}
PAGES=${PAGES:-30}
TRIPS=${TRIPS:-200}
LOADS=${LOADS:-10}
SESSIONS=${SESSIONS:-1000}

bash scripts/deps.sh haproxy curl
tmp=$(mktemp -d)
pids=()
export SHINYCTL_HOME="$tmp/home"
cleanup() {
    # The daemon first and waited for, so it starts nothing new; then what it
    # started (by PID, from its status), then our own children.
    if [ -S "$SHINYCTL_HOME/api.sock" ]; then
        local status daemon
        status=$(target/release/shinyctl status --json 2>/dev/null || true)
        daemon=$(sed -n 's/.*"daemon_pid": *\([0-9]*\).*/\1/p' <<<"$status" | head -n 1)
        if [ -n "$daemon" ]; then
            kill "$daemon" 2>/dev/null || true
            for _ in $(seq 1 100); do kill -0 "$daemon" 2>/dev/null || break; sleep 0.05; done
        fi
        for pid in $(grep -o '"\(proxy_pid\|pid\)": *[0-9]*' <<<"$status" | grep -o '[0-9]*$'); do
            kill -- "-$pid" 2>/dev/null || kill "$pid" 2>/dev/null || true
        done
    fi
    for pid in "${pids[@]}"; do kill -- "-$pid" 2>/dev/null || kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$tmp"
}
trap cleanup EXIT

cargo build --release --bin shinyctl --example shiny_client 2>"$tmp/build.log" || { cat "$tmp/build.log" >&2; exit 1; }
client=target/release/examples/shiny_client
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
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

# Straight from R.
direct=$(free_port)
setsid R --no-echo --no-restore -e "shiny::runApp('$tmp/app', port = ${direct}L, launch.browser = FALSE)" >"$tmp/direct.log" 2>&1 &
pids+=($!)
# Through shinyctl: its own copy of the same app.
shinyctl=$(free_port)
printf 'app-name: benchapp\nport: %s\nworking-dir: %s\nwarm-replicas: 0\nidle-timeout: 0\n' "$shinyctl" "$tmp/app" >"$tmp/app.yaml"
target/release/shinyctl apply -f "$tmp/app.yaml" >/dev/null
# Through HAProxy, in front of the direct R process (an inserted cookie, as shinyctl does).
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
    (cd "$tmp/app" && setsid faucet start --host "127.0.0.1:$faucet_port" --workers 1 >"$tmp/faucet.log" 2>&1) &
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
median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

echo "A Shiny app (fluidPage, numericInput, textOutput); median of $ROUNDS alternating rounds, ms"
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

# The load event in headless Chromium, cache off, direct and through shinyctl.
if command -v chromedriver >/dev/null 2>&1 && command -v chromium >/dev/null 2>&1; then
    cd_port=$(free_port)
    setsid chromedriver --port="$cd_port" >"$tmp/chromedriver.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 1 100); do curl -fsS "http://127.0.0.1:$cd_port/status" >/dev/null 2>&1 && break; sleep 0.1; done
    wd() { curl -fsS -X "$1" -H 'Content-Type: application/json' "http://127.0.0.1:$cd_port$2" ${3:+-d "$3"}; }
    caps='{"capabilities":{"alwaysMatch":{"browserName":"chrome","goog:chromeOptions":{"binary":"/usr/bin/chromium","args":["--headless=new","--no-sandbox","--disable-gpu","--disable-dev-shm-usage","--user-data-dir='"$tmp"'/profile"]}}}}'
    session=$(wd POST /session "$caps" | python3 -c 'import json,sys; print(json.load(sys.stdin)["value"]["sessionId"])')
    wd POST "/session/$session/goog/cdp/execute" '{"cmd":"Network.enable","params":{}}' >/dev/null
    wd POST "/session/$session/goog/cdp/execute" '{"cmd":"Network.setCacheDisabled","params":{"cacheDisabled":true}}' >/dev/null
    declare -A load
    for _ in $(seq 1 "$LOADS"); do
        for name in direct shinyctl; do
            [ "$name" = direct ] && p=$direct || p=$shinyctl
            wd POST "/session/$session/url" "{\"url\":\"http://127.0.0.1:$p/\"}" >/dev/null
            ms=$(wd POST "/session/$session/execute/sync" '{"script":"var e = performance.getEntriesByType(\"navigation\")[0]; return e.loadEventEnd - e.startTime;","args":[]}' |
                python3 -c 'import json,sys; print(json.load(sys.stdin)["value"])')
            load[$name]+="$ms "
        done
    done
    wd DELETE "/session/$session" >/dev/null || true
    d=$(median <<<"${load[direct]}")
    s=$(median <<<"${load[shinyctl]}")
    printf 'Chromium load event, cache off, median of %s: direct %.1f ms, shinyctl %.1f ms, ratio %s\n' "$LOADS" "$d" "$s" \
        "$(awk -v a="$s" -v b="$d" 'BEGIN {printf "%.2f", a / b}')"
fi

# The load balancer's memory with SESSIONS open Shiny sessions.
proxy_pid=$(target/release/shinyctl status --json | sed -n 's/.*"proxy_pid": *\([0-9]*\).*/\1/p' | head -n 1)
rss() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
before=$(rss "$proxy_pid")
coproc HOLD { "$client" hold "$shinyctl" "$SESSIONS"; }
read -r opened <&"${HOLD[0]}"
[ "$opened" = open ] || { echo "bench/shiny.sh: could not open $SESSIONS sessions" >&2; exit 1; }
during=$(rss "$proxy_pid")
exec {HOLD[1]}>&-
wait "$HOLD_PID" 2>/dev/null || true
awk -v b="$before" -v d="$during" -v n="$SESSIONS" \
    'BEGIN {printf "shinyctl proxy RSS: %.1f MiB idle, %.1f MiB with %d open sessions (%.1f KB each)\n", b/1024, d/1024, n, (d-b)/n}'
