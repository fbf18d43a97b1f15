#!/usr/bin/env bash
# Hostile clients at scale against shinyctl's load balancer, as a user runs
# it: the daemon starts a small fast backend as an app (bench/rig.sh) on
# every address, so a flood from another address of this machine reaches it
# as a visitor that is not loopback. Prints other visitors' latency (p50,
# p99 over new connections; a warm-up batch first, not compared) before and
# during IDLE idle connections, slow headers, slowly sent bodies, huge
# headers and malformed WebSocket upgrades, as a ratio; what those inputs
# got; what a flood from an address that is not loopback got (the
# per-address cap); and the load balancer's memory before, at its peak
# during, and after, with what each held connection cost at the peak.
#
# Fails when a visitor is not answered, a hostile connection cannot be
# opened, huge headers get anything but 431, a malformed upgrade gets a
# tunnel, the flood is not capped, the copy died or was replaced, or
# api.log has a panic or a copy marked down.
#
#   bench/hostile.sh                 # IDLE=5000, a flood of 1000
#   IDLE=9000 bench/hostile.sh
#   BENCH_SHORT=1 bench/hostile.sh   # IDLE=200, a flood of 400, a debug build
#
# Needs: cargo, python3. Uses its own SHINYCTL_HOME and free ports;
# everything it starts is stopped by PID on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/rig.sh

IDLE=${IDLE:-$(pick 200 5000)}
FLOOD=${FLOOD:-$(pick 400 1000)}
ODD_ROUNDS=${ODD_ROUNDS:-$(pick 5 50)}

bench_build bench_backend hostile_client
# The daemon, so the load balancer, inherits this shell's open-files limit,
# and the client holds IDLE connections and more: both go up to the hard one.
ulimit -n "$(ulimit -Hn)"
app_port=$(free_port)
fast_app hostile "$app_port" 1 "host: 0.0.0.0
warm-replicas: 0
"
proxy_pid=$(status_py 'j["proxy_pid"]')
copy_before=$copy_pid

rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }
before=$(rss_kib "$proxy_pid")
other=$(hostname -I 2>/dev/null | tr ' ' '\n' | grep -E '^[0-9]+\.' | grep -v '^127\.' | head -n 1 || true)
"$examples/hostile_client" "$app_port" "$IDLE" "$other" "$FLOOD" "$ODD_ROUNDS" >"$tmp/client.out" &
client_pid=$!
pids+=("$client_pid")
peak=$before
while kill -0 "$client_pid" 2>/dev/null; do
    now=$(rss_kib "$proxy_pid")
    [ "$now" -gt "$peak" ] && peak=$now
    sleep 0.2
done
client_status=0
wait "$client_pid" || client_status=$?
after=$(rss_kib "$proxy_pid")

echo "shinyctl's load balancer in front of the fast backend (an app, fenced), $(nproc) cores, $(basename "$(dirname "$bin")") build, open files: soft $(awk '/^Max open files/ {print $4}' "/proc/$proxy_pid/limits")"
cat "$tmp/client.out"
held=$(sed -n 's/^held: *\([0-9]*\) connections.*/\1/p' "$tmp/client.out")
awk -v b="$before" -v p="$peak" -v a="$after" -v n="${held:-0}" 'BEGIN {
    printf "load balancer RSS: %.1f MiB before, %.1f MiB at the peak, %.1f MiB after", b / 1024, p / 1024, a / 1024
    if (n > 0) printf "; (peak - before) / %d held connections = %.1f KiB each", n, (p - b) / n
    printf "\n"
}'
failed=0
[ "$client_status" = 0 ] || { echo "the client found failures (FAILED lines above)"; failed=1; }
copy_now=$(status_py "' '.join(str(c['pid']) for a in j['apps'] for c in a['copies'] if c['ready'])")
[ "$copy_now" = "$copy_before" ] || { echo "the copy changed: $copy_before before, '$copy_now' after"; failed=1; }
if grep -q panicked "$SHINYCTL_HOME/api.log"; then echo "a panic in api.log:"; grep panicked "$SHINYCTL_HOME/api.log"; failed=1; fi
if grep -q "gets no visitor until it comes back" "$SHINYCTL_HOME/api.log"; then echo "a copy was marked down"; failed=1; fi
[ "$failed" = 0 ] || exit 1
echo "every visitor answered, no tunnel, the flood capped, no panic, no copy marked down or replaced"
