#!/usr/bin/env bash
# How fast `shinyctl status` answers, with the example app running (two real
# R copies), side by side with `shinyctl version` (the same process start,
# no API call) in the same run. Prints p50 and p99 of each and the ratio.
#
#   bench/status.sh            # 200 runs each
#   RUNS=500 bench/status.sh
#   BIN=target/debug/shinyctl bench/status.sh   # another build
#
# Then status again while the daemon is busy with something slow: a
# redeploy (a release is taken and new copies start), the load balancer
# killed and started again, and a copy log of over 1 GiB rotating. The
# daemon's lock is never held across those, so status stays as fast.
#
# Uses its own temporary SHINYCTL_HOME and a free port; everything it starts
# is stopped by PID on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-200}

if [ -z "${BIN:-}" ]; then
    cargo build --release --bin shinyctl 2>/dev/null
    BIN=target/release/shinyctl
fi
bin=$(realpath "$BIN")
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

# status timed over and over while "$@" runs in the background (at least
# 3 s, at most 60 s); prints p50, p99 and the slowest.
during() {
    local name=$1 out="$tmp/during-$2.us"
    shift 2
    : >"$out"
    "$@" &
    local bg=$! t_end=$((${EPOCHREALTIME/./} + 3000000))
    while kill -0 "$bg" 2>/dev/null || [ "${EPOCHREALTIME/./}" -lt "$t_end" ]; do
        time_once "$out" "$bin" status
        [ "$(wc -l <"$out")" -lt 3000 ] || break
    done
    wait "$bg" || true
    awk -v n="$name" -v p50="$(pct 50 <"$out")" -v p99="$(pct 99 <"$out")" -v mx="$(sort -n "$out" | tail -1)" -v c="$(wc -l <"$out")" \
        'BEGIN { printf "%-34s %8.1fms %8.1fms %8.1fms  (%d runs)\n", n, p50 / 1000, p99 / 1000, mx / 1000, c }'
}
proxy_pid() { "$bin" status --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["proxy_pid"] or "")'; }
restart_and_wait() {
    "$bin" restart bench >/dev/null
    for _ in $(seq 1 600); do
        "$bin" status --json | python3 -c 'import json,sys
j=json.load(sys.stdin); c=j["apps"][0]["copies"]
sys.exit(0 if len(c) == 2 and all(x["ready"] and not x["outdated"] for x in c) else 1)' && return 0
        sleep 0.1
    done
}
kill_proxy_and_wait() {
    local old; old=$(proxy_pid)
    [ -n "$old" ] && kill -9 "$old"
    for _ in $(seq 1 300); do
        local new; new=$(proxy_pid)
        [ -n "$new" ] && [ "$new" != "$old" ] && curl -s -o /dev/null "http://127.0.0.1:$port/" && return 0
        sleep 0.05
    done
}
grow_log_and_wait_rotation() {
    local log=$SHINYCTL_HOME/logs/default-bench.log
    head -c 1100M /dev/zero >>"$log"
    for _ in $(seq 1 600); do
        [ -e "$log.1" ] && [ "$(stat -c %s "$log")" -lt 1000000000 ] && return 0
        sleep 0.1
    done
}
echo
echo "status while the daemon is busy (every run alternates with nothing)"
printf "%-34s %10s %10s %10s\n" "during" "p50" "p99" "max"
during "a redeploy (restart)" redeploy restart_and_wait
during "the load balancer killed, restarted" proxy kill_proxy_and_wait
during "a 1.1 GiB copy log rotating" rotate grow_log_and_wait_rotation
