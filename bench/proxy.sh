#!/usr/bin/env bash
# Benchmarks the shinyctl load balancer against HAProxy, in one run with the
# same settings: wrk straight at a small fast backend ("direct"), through
# `shinyctl proxy`, and through HAProxy (mode http, sticky cookie inserted,
# one server). Prints requests/s, p50 and p99 latency for each, the ratios,
# and the resident memory of both load balancers after the load.
#
#   bench/proxy.sh                    # defaults: wrk -t2 -c32 -d10s --latency
#   DURATION=30s CONNS=64 bench/proxy.sh
#
# Needs: cargo, wrk, haproxy, curl. Everything it starts is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-10s}
THREADS=${THREADS:-2}
CONNS=${CONNS:-32}
BACKEND_PORT=${BACKEND_PORT:-20990}
PROXY_PORT=${PROXY_PORT:-18990}
HAPROXY_PORT=${HAPROXY_PORT:-18991}

bash scripts/deps.sh wrk haproxy curl
for tool in wrk haproxy curl cargo; do
    command -v "$tool" >/dev/null || { echo "bench/proxy.sh: $tool is not installed" >&2; exit 1; }
done
# A leftover listener on these ports would take part of the load (both load
# balancers use SO_REUSEPORT) and skew every figure.
for port in "$BACKEND_PORT" "$PROXY_PORT" "$HAPROXY_PORT"; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        echo "bench/proxy.sh: port $port is already in use; stop what listens there or set BACKEND_PORT, PROXY_PORT, HAPROXY_PORT" >&2
        exit 1
    fi
done

tmp=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$tmp"
}
trap cleanup EXIT

if ! cargo build --release --bin shinyctl --example bench_backend 2>"$tmp/build.log"; then
    cat "$tmp/build.log" >&2
    exit 1
fi

wait_port() {
    for _ in $(seq 1 100); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
        sleep 0.05
    done
    echo "bench/proxy.sh: nothing listens on port $1" >&2
    exit 1
}

# The backend.
target/release/examples/bench_backend "$BACKEND_PORT" &
backend_pid=$!
pids+=("$backend_pid")
wait_port "$BACKEND_PORT"

# shinyctl proxy, with a one-copy table pushed over its socket.
home="$tmp/home"
mkdir -m 700 "$home" "$home/proxy"
# The cookie key, as the daemon makes it (the load balancer only reads it).
(umask 077 && head -c 32 /dev/urandom >"$home/proxy/cookie.key")
SHINYCTL_HOME="$home" target/release/shinyctl proxy 2>"$tmp/proxy.log" &
proxy_pid=$!
pids+=("$proxy_pid")
for _ in $(seq 1 100); do [ -S "$home/proxy/proxy.sock" ] && break; sleep 0.05; done
cat >"$tmp/table.json" <<EOF
{"apps":[{"name":"bench","host":"127.0.0.1","port":$PROXY_PORT,"policy":"least-conn","request_timeout_ms":30000,
  "copies":[{"copy":1,"port":$BACKEND_PORT,"role":"active","pid":$backend_pid}]}]}
EOF
curl -sf --unix-socket "$home/proxy/proxy.sock" -X PUT http://shinyctl/table --data-binary @"$tmp/table.json" >/dev/null
wait_port "$PROXY_PORT"

# HAProxy with the same number of threads as the proxy's runtime.
cat >"$tmp/haproxy.cfg" <<EOF
global
    nbthread 2
    maxconn 4096
defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s
frontend fe
    bind 127.0.0.1:$HAPROXY_PORT
    default_backend be
backend be
    cookie lb insert indirect nocache
    server copy1 127.0.0.1:$BACKEND_PORT cookie 1
EOF
haproxy -db -f "$tmp/haproxy.cfg" 2>"$tmp/haproxy.log" &
haproxy_pid=$!
pids+=("$haproxy_pid")
wait_port "$HAPROXY_PORT"

# Both must answer (and the proxy set its cookie) before measuring.
curl -sfi "http://127.0.0.1:$PROXY_PORT/" | grep -qi '^set-cookie: lb_' || { echo "bench/proxy.sh: the proxy does not answer" >&2; cat "$tmp/proxy.log" >&2; exit 1; }
curl -sf "http://127.0.0.1:$HAPROXY_PORT/" >/dev/null || { echo "bench/proxy.sh: haproxy does not answer" >&2; cat "$tmp/haproxy.log" >&2; exit 1; }

declare -A rps p50 p99
run() {
    local name=$1 port=$2 out
    wrk -t"$THREADS" -c"$CONNS" -d2s "http://127.0.0.1:$port/" >/dev/null # warm-up
    out=$(wrk -t"$THREADS" -c"$CONNS" -d"$DURATION" --latency "http://127.0.0.1:$port/")
    if grep -q 'Non-2xx\|Socket errors' <<<"$out"; then
        echo "bench/proxy.sh: errors while measuring $name:" >&2
        grep 'Non-2xx\|Socket errors' <<<"$out" >&2
    fi
    rps[$name]=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
    p50[$name]=$(awk '$1 == "50%" {print $2}' <<<"$out")
    p99[$name]=$(awk '$1 == "99%" {print $2}' <<<"$out")
}
run direct "$BACKEND_PORT"
run shinyctl "$PROXY_PORT"
run haproxy "$HAPROXY_PORT"

rss_mib() { awk '/^VmRSS:/ {printf "%.1f MiB", $2 / 1024}' "/proc/$1/status"; }

echo
echo "wrk -t$THREADS -c$CONNS -d$DURATION --latency, $(nproc) cores, $(haproxy -v | head -n 1 | awk '{print "HAProxy " $3}')"
printf '%-10s %12s %10s %10s\n' "target" "requests/s" "p50" "p99"
for name in direct shinyctl haproxy; do
    printf '%-10s %12s %10s %10s\n' "$name" "${rps[$name]}" "${p50[$name]}" "${p99[$name]}"
done
awk -v p="${rps[shinyctl]}" -v h="${rps[haproxy]}" -v d="${rps[direct]}" \
    'BEGIN { printf "shinyctl/haproxy: %.2f   shinyctl/direct: %.2f\n", p / h, p / d }'
echo "RSS after the load: shinyctl proxy $(rss_mib "$proxy_pid"), haproxy $(rss_mib "$haproxy_pid")"
