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

# The daemon first, waited for: one still running would start a new load
# balancer when it saw the old one end. Then the load balancer and the
# copies (each leads its own process group), waited for too.
cleanup() {
    local daemon others
    read -r daemon others < <("$bin" status --json 2>/dev/null | python3 -c 'import json,sys
j=json.load(sys.stdin); print(" ".join(str(p) for p in [j["daemon_pid"] or 0, j["proxy_pid"]] + [c["pid"] for a in j["apps"] for c in a["copies"]] if p is not None))' || true)
    stop_and_wait "$daemon"
    for pid in $others; do kill -- "-$pid" 2>/dev/null || kill "$pid" 2>/dev/null || true; done
    for pid in $others; do stop_and_wait "$pid"; done
    rm -rf "$tmp"
}
# Ends one process by PID: SIGTERM, up to 15 s, then SIGKILL.
stop_and_wait() {
    local pid=$1
    [ -n "$pid" ] && [ "$pid" != 0 ] || return 0
    kill "$pid" 2>/dev/null || return 0
    for _ in $(seq 1 150); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.1
    done
    kill -9 -- "-$pid" 2>/dev/null || kill -9 "$pid" 2>/dev/null || true
}
trap cleanup EXIT

"$bin" apply -f "$tmp/app/app.yaml" >/dev/null 2>&1
ready=0
for _ in $(seq 1 600); do
    if "$bin" status --json | grep -q '"ready":true.*"ready":true'; then ready=1; break; fi
    sleep 0.1
done
if [ "$ready" != 1 ]; then
    echo "bench/status.sh: the example app's two copies were not ready within 60 s" >&2
    "$bin" status >&2 || true
    exit 1
fi

# One duration in microseconds per run, appended to $1; $EPOCHREALTIME is
# read by the shell itself, so no process start sits inside the interval.
time_once() {
    local out=$1 t0 t1
    shift
    t0=${EPOCHREALTIME/./}
    "$@" >/dev/null
    t1=${EPOCHREALTIME/./}
    echo $((t1 - t0)) >>"$out"
}
pct() { sort -n | awk -v p="$1" '{a[NR]=$1} END {i=int(NR*p/100); if (i<1) i=1; print a[i]}'; }

# The two alternate, so a change in the machine's load falls on both alike.
for _ in $(seq 1 "$RUNS"); do
    time_once "$tmp/version.us" "$bin" version
    time_once "$tmp/status.us" "$bin" status
done
v50=$(pct 50 < "$tmp/version.us"); v99=$(pct 99 < "$tmp/version.us")
s50=$(pct 50 < "$tmp/status.us"); s99=$(pct 99 < "$tmp/status.us")
echo "$RUNS runs each, the example app running (2 R copies)"
awk -v v50="$v50" -v v99="$v99" -v s50="$s50" -v s99="$s99" 'BEGIN {
    printf "%-18s %10s %10s\n", "command", "p50", "p99"
    printf "%-18s %8.1fms %8.1fms\n", "shinyctl version", v50 / 1000, v99 / 1000
    printf "%-18s %8.1fms %8.1fms\n", "shinyctl status", s50 / 1000, s99 / 1000
    printf "status/version (p50): %.2f\n", s50 / v50
}'
