#!/usr/bin/env bash
# Every bench once in its short mode (BENCH_SHORT=1: one round of a few
# samples, a debug build), so a bench that no longer runs fails CI.
# ./test.sh runs it after the cargo tests; the figures of a short run mean
# nothing, the README's come from full runs.
#
#   bench/short.sh              # every bench
#   bench/short.sh proxy shiny  # only these
#
# Prints each bench's time and output; the exit status is 1 when any failed,
# naming them.
set -uo pipefail
cd "$(dirname "$0")/.."
names=("$@")
if [ "${#names[@]}" -eq 0 ]; then
    for f in bench/*.sh; do
        case "$f" in bench/rig.sh | bench/short.sh) ;; *) names+=("$(basename "$f" .sh)") ;; esac
    done
fi
failed=()
t_all=${EPOCHREALTIME/./}
for name in "${names[@]}"; do
    echo "--- bench/$name.sh (short)"
    t0=${EPOCHREALTIME/./}
    BENCH_SHORT=1 bash "bench/$name.sh" 2>&1
    status=$?
    t1=${EPOCHREALTIME/./}
    secs=$(awk -v us=$((t1 - t0)) 'BEGIN {printf "%.1f", us / 1e6}')
    if [ "$status" -eq 0 ]; then
        echo "--- bench/$name.sh: ok in $secs s"
    else
        echo "--- bench/$name.sh: FAILED (exit $status) in $secs s"
        failed+=("$name")
    fi
done
total=$(awk -v us=$((${EPOCHREALTIME/./} - t_all)) 'BEGIN {printf "%.1f", us / 1e6}')
if [ "${#failed[@]}" -gt 0 ]; then
    echo "benches in short mode: ${failed[*]} failed (${#names[@]} run in $total s)"
    exit 1
fi
echo "benches in short mode: all ${#names[@]} ran in $total s"
