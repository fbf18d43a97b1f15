#!/usr/bin/env bash
# How fast `shinyctl status` answers, with the example app running (two real
# R copies), side by side with `shinyctl version` (the same process start,
# no API call) in the same run. Prints p50 and p99 of each and the ratio.
#
#   bench/status.sh            # 200 runs each
#   RUNS=500 bench/status.sh
#   BIN=target/debug/shinyctl bench/status.sh   # another build
#   BENCH_SHORT=1 bench/status.sh               # 10 runs, 1 s each busy, a debug build
#
# Then status again while the daemon is busy with something slow: a
# redeploy (a release is taken and new copies start), the load balancer
# killed and started again, and a copy log of over 1 GiB rotating. The
# daemon's lock is never held across those, so status stays as fast. Each
# of those must finish (the new copies ready, a new load balancer
# answering, the log rotated), or the bench fails.
#
# Uses its own temporary SHINYCTL_HOME and a free port; everything it starts
# is stopped by PID on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/rig.sh
RUNS=${RUNS:-$(pick 10 200)}
BUSY_SECS=$(pick 1 3)

port=$(free_port)
if [ "$short" = 1 ]; then
    # Short mode checks that the bench runs, not R: the fast backend
    # (bench/rig.sh) stands in for the example app's two copies.
    bench_build bench_backend
    fast_app bench "$port" 2 "warm-replicas: 1
"
    what="the fast backend as the app (2 copies; short mode)"
else
    bench_build
    mkdir -p "$tmp/app"
    cp examples/hello/app.R "$tmp/app/"
    printf 'app-name: bench\nport: %s\n' "$port" >"$tmp/app/app.yaml"
    bench_apply "$tmp/app/app.yaml"
    wait_copies bench 2
    what="the example app running (2 R copies)"
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
echo "$RUNS runs each, $what, $(basename "$(dirname "$bin")") build"
awk -v v50="$v50" -v v99="$v99" -v s50="$s50" -v s99="$s99" 'BEGIN {
    printf "%-18s %10s %10s\n", "command", "p50", "p99"
    printf "%-18s %8.1fms %8.1fms\n", "shinyctl version", v50 / 1000, v99 / 1000
    printf "%-18s %8.1fms %8.1fms\n", "shinyctl status", s50 / 1000, s99 / 1000
    printf "status/version (p50): %.2f\n", s50 / v50
}'

# status timed over and over while "$@" runs in the background (at least
# BUSY_SECS, at most 3000 runs); prints p50, p99 and the slowest. The
# background action's failure fails the bench.
during() {
    local name=$1 out="$tmp/during-$2.us"
    shift 2
    : >"$out"
    "$@" &
    local bg=$! t_end=$((${EPOCHREALTIME/./} + BUSY_SECS * 1000000))
    while kill -0 "$bg" 2>/dev/null || [ "${EPOCHREALTIME/./}" -lt "$t_end" ]; do
        time_once "$out" "$bin" status
        [ "$(wc -l <"$out")" -lt 3000 ] || break
    done
    if ! wait "$bg"; then
        echo "bench/status.sh: $name did not finish" >&2
        exit 1
    fi
    awk -v n="$name" -v p50="$(pct 50 <"$out")" -v p99="$(pct 99 <"$out")" -v mx="$(sort -n "$out" | tail -1)" -v c="$(wc -l <"$out")" \
        'BEGIN { printf "%-34s %8.1fms %8.1fms %8.1fms  (%d runs)\n", n, p50 / 1000, p99 / 1000, mx / 1000, c }'
}
proxy_pid() { "$bin" status --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["proxy_pid"] or "")'; }
restart_and_wait() {
    "$bin" restart bench >/dev/null
    local end=$((SECONDS + 60))
    while [ "$SECONDS" -lt "$end" ]; do
        "$bin" status --json | python3 -c 'import json,sys
j=json.load(sys.stdin); c=j["apps"][0]["copies"]
sys.exit(0 if len(c) == 2 and all(x["ready"] and not x["outdated"] for x in c) else 1)' && return 0
        sleep 0.1
    done
    echo "bench/status.sh: after the restart, the new copies were not ready within 60 s" >&2
    return 1
}
kill_proxy_and_wait() {
    local old; old=$(proxy_pid)
    [ -n "$old" ] || { echo "bench/status.sh: no load balancer to kill" >&2; return 1; }
    kill -9 "$old"
    local end=$((SECONDS + 15))
    while [ "$SECONDS" -lt "$end" ]; do
        local new; new=$(proxy_pid)
        [ -n "$new" ] && [ "$new" != "$old" ] && curl -s -o /dev/null "http://127.0.0.1:$port/" && return 0
        sleep 0.05
    done
    echo "bench/status.sh: no new load balancer answered within 15 s" >&2
    return 1
}
grow_log_and_wait_rotation() {
    # A copy that runs now: the redeploy before gave the copies new numbers,
    # and only a current copy's log (and api.log) is rotated.
    local log
    log=$("$bin" status --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["apps"][0]["copies"][0]["log"])')
    head -c 1100M /dev/zero >>"$log"
    local end=$((SECONDS + 60))
    while [ "$SECONDS" -lt "$end" ]; do
        [ -e "$log.1" ] && [ "$(stat -c %s "$log")" -lt 1000000000 ] && return 0
        sleep 0.1
    done
    echo "bench/status.sh: the 1.1 GiB log was not rotated within 60 s" >&2
    return 1
}
echo
echo "status while the daemon is busy (every run alternates with nothing)"
printf "%-34s %10s %10s %10s\n" "during" "p50" "p99" "max"
during "a redeploy (restart)" redeploy restart_and_wait
during "the load balancer killed, restarted" proxy kill_proxy_and_wait
during "a 1.1 GiB copy log rotating" rotate grow_log_and_wait_rotation
