#!/usr/bin/env bash
# How fast `shinyctl status` answers, with the example app running (two real
# R copies), side by side with `shinyctl version` (the same process start,
# no API call) in the same run. Prints p50 and p99 of each and the ratio.
#
#   bench/status.sh            # 200 runs each
#   RUNS=500 bench/status.sh
#
# Uses its own temporary SHINYCTL_HOME and a free port; everything it starts
# is stopped by PID on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-200}

cargo build --release --bin shinyctl 2>/dev/null
bin=$PWD/target/release/shinyctl
tmp=$(mktemp -d)
export SHINYCTL_HOME=$tmp/home
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
mkdir -p "$tmp/app"
cp examples/hello/app.R "$tmp/app/"
printf 'app-name: bench\nport: %s\n' "$port" > "$tmp/app/app.yaml"

cleanup() {
    local pids
    pids=$("$bin" status --json 2>/dev/null | python3 -c 'import json,sys
j=json.load(sys.stdin); print(" ".join(str(p) for p in [j["daemon_pid"], j["proxy_pid"]] + [c["pid"] for a in j["apps"] for c in a["copies"]] if p))' || true)
    for pid in $pids; do kill "$pid" 2>/dev/null || true; done
    sleep 1
    rm -rf "$tmp"
}
trap cleanup EXIT

"$bin" apply -f "$tmp/app/app.yaml" >/dev/null 2>&1
for _ in $(seq 1 200); do
    "$bin" status --json | grep -q '"ready":true.*"ready":true' && break
    sleep 0.1
done

measure() { # prints one duration in microseconds per line
    for _ in $(seq 1 "$RUNS"); do
        local t0 t1
        t0=$(date +%s%N)
        "$@" >/dev/null
        t1=$(date +%s%N)
        echo $(((t1 - t0) / 1000))
    done
}
pct() { sort -n | awk -v p="$1" '{a[NR]=$1} END {i=int(NR*p/100); if (i<1) i=1; print a[i]}'; }

measure "$bin" version > "$tmp/version.us"
measure "$bin" status > "$tmp/status.us"
v50=$(pct 50 < "$tmp/version.us"); v99=$(pct 99 < "$tmp/version.us")
s50=$(pct 50 < "$tmp/status.us"); s99=$(pct 99 < "$tmp/status.us")
echo "$RUNS runs each, the example app running (2 R copies)"
awk -v v50="$v50" -v v99="$v99" -v s50="$s50" -v s99="$s99" 'BEGIN {
    printf "%-18s %10s %10s\n", "command", "p50", "p99"
    printf "%-18s %8.1fms %8.1fms\n", "shinyctl version", v50 / 1000, v99 / 1000
    printf "%-18s %8.1fms %8.1fms\n", "shinyctl status", s50 / 1000, s99 / 1000
    printf "status/version (p50): %.2f\n", s50 / v50
}'
