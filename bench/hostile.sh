#!/usr/bin/env bash
# Hostile clients at scale against `shinyctl proxy` in front of a small fast
# backend: other visitors' latency (p50, p99 over new connections) before
# and during IDLE idle connections, slow headers, slowly sent bodies, huge
# headers and malformed WebSocket upgrades, as a ratio; what those inputs
# got; a flood from an address that is not loopback (the per-address cap);
# and the load balancer's memory before, at its peak during, and after.
#
#   bench/hostile.sh                 # IDLE=5000
#   IDLE=10000 bench/hostile.sh
#
# Needs: cargo, curl. Everything it starts is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

IDLE=${IDLE:-5000}
BACKEND_PORT=${BACKEND_PORT:-20993}
PROXY_PORT=${PROXY_PORT:-18993}

for port in "$BACKEND_PORT" "$PROXY_PORT"; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        echo "bench/hostile.sh: port $port is already in use; set BACKEND_PORT, PROXY_PORT" >&2
        exit 1
    fi
done

source bench/rig.sh

if ! cargo build --release --bin shinyctl --example bench_backend --example hostile_client 2>"$tmp/build.log"; then
    cat "$tmp/build.log" >&2
    exit 1
fi

# The backend and shinyctl proxy in front of it, listening on every
# address, so the flood from another local address reaches it as a visitor
# that is not loopback.
start_rig 0.0.0.0

rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }
before=$(rss_kib "$proxy_pid")
other=$(hostname -I 2>/dev/null | tr ' ' '\n' | grep -E '^[0-9]+\.' | grep -v '^127\.' | head -n 1 || true)
# The client holds IDLE connections and more: its own soft limit goes up.
ulimit -n "$(ulimit -Hn)"
target/release/examples/hostile_client "$PROXY_PORT" "$IDLE" "$other" >"$tmp/client.out" &
client_pid=$!
pids+=("$client_pid")
peak=$before
while kill -0 "$client_pid" 2>/dev/null; do
    now=$(rss_kib "$proxy_pid")
    [ "$now" -gt "$peak" ] && peak=$now
    sleep 0.2
done
wait "$client_pid"
sleep 1
after=$(rss_kib "$proxy_pid")

echo "shinyctl proxy in front of a fast backend, $(nproc) cores, open files: soft $(awk '/^Max open files/ {print $4}' /proc/$proxy_pid/limits)"
cat "$tmp/client.out"
awk -v b="$before" -v p="$peak" -v a="$after" 'BEGIN {printf "load balancer RSS: %.1f MiB before, %.1f MiB at the peak, %.1f MiB after\n", b / 1024, p / 1024, a / 1024}'
if grep -q panicked "$tmp/proxy.log"; then echo "the load balancer panicked:"; grep panicked "$tmp/proxy.log"; exit 1; fi
if grep -q "gets no visitor until it comes back" "$tmp/proxy.log"; then echo "a copy was marked down"; exit 1; fi
echo "no panic, no copy marked down"
