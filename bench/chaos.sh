#!/usr/bin/env bash
# Chaos, for minutes: request loops from three clients (a new visitor every
# 10 ms each) and four open Shiny sessions (an input every 500 ms), while at
# random instants a copy, the daemon or the load balancer is SIGKILLed, the
# app is redeployed or scaled, and the daemon is upgraded onto another build.
# Prints requests sent, failed and refused, requests in flight at a load
# balancer's SIGKILL (counted apart), sessions cut and by what, orphan
# processes and torn files.
#
#   bench/chaos.sh                         # 240 s, seed 1
#   CHAOS_SECS=600 CHAOS_SEED=42 bench/chaos.sh
#   BENCH_SHORT=1 bench/chaos.sh           # only checks that the test exists
#
# The run is the suite's chaos test at length (tests/it/chaos.rs), with its
# own SHINYCTL_HOME and ports; everything it starts is ended by PID. In
# short mode (./test.sh) it only lists the test (a debug build): the suite
# already runs the same run for 40 s (chaos::a_short_chaos_run_loses_nothing),
# and a shorter one would not see every kind of fault.
set -euo pipefail
cd "$(dirname "$0")/.."
test_name=chaos::a_long_chaos_run
case "${BENCH_SHORT:-}" in
"" | 0) ;;
*)
    listed=$(cargo test --test it -- --ignored --exact "$test_name" --list 2>/dev/null)
    grep -q "^$test_name: test" <<<"$listed" || { echo "bench/chaos.sh: the suite has no test $test_name" >&2; exit 1; }
    echo "bench/chaos.sh: $test_name is there (short mode runs nothing more)"
    exit 0
    ;;
esac
export CHAOS_SECS=${CHAOS_SECS:-240} CHAOS_SEED=${CHAOS_SEED:-1}
cargo test --release --test it -- --ignored --exact "$test_name" --nocapture 2>&1 |
    grep -E '^(chaos:|requests|sessions|orphans|request failed|session on|at [0-9]+ ms)|panicked|test result'
