#!/usr/bin/env bash
# Benchmarks the shinyctl load balancer against HAProxy, in one run with the
# same settings: wrk straight at a small fast backend ("direct"), through
# `shinyctl proxy`, and through HAProxy (mode http, sticky cookie inserted,
# one server). ROUNDS rounds, the three targets in turn within each, so a
# change in the machine's load falls on all of them. Prints requests/s, p50
# and p99 latency of each round, the median and range of the ratios, and the
# resident memory of both load balancers after the load. Any non-2xx answer
# or socket error fails the run: a speed of errors is no speed.
#
#   bench/proxy.sh                    # defaults: 5 rounds of wrk -t2 -c32 -d10s --latency
#   ROUNDS=9 DURATION=30s CONNS=64 bench/proxy.sh
#
# Needs: cargo, wrk, haproxy, curl. Everything it starts is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-5}
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

source bench/rig.sh

if ! cargo build --release --bin shinyctl --example bench_backend 2>"$tmp/build.log"; then
    cat "$tmp/build.log" >&2
    exit 1
fi

# The backend and shinyctl proxy in front of it.
start_rig 127.0.0.1

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

run() { # one measurement of $1 on port $2, appended to $tmp/results
    local name=$1 port=$2 round=$3 out
    wrk -t"$THREADS" -c"$CONNS" -d2s "http://127.0.0.1:$port/" >/dev/null # warm-up
    out=$(wrk -t"$THREADS" -c"$CONNS" -d"$DURATION" --latency "http://127.0.0.1:$port/")
    if grep -q 'Non-2xx\|Socket errors' <<<"$out"; then
        echo "bench/proxy.sh: errors while measuring $name (round $round):" >&2
        grep 'Non-2xx\|Socket errors' <<<"$out" >&2
        exit 1
    fi
    echo "$round $name $(awk '/^Requests\/sec:/ {print $2}' <<<"$out") $(awk '$1 == "50%" {print $2}' <<<"$out") $(awk '$1 == "99%" {print $2}' <<<"$out")" >>"$tmp/results"
}
targets=("direct $BACKEND_PORT" "shinyctl $PROXY_PORT" "haproxy $HAPROXY_PORT")
for round in $(seq 1 "$ROUNDS"); do
    # A different target first in each round.
    for i in 0 1 2; do
        read -r name port <<<"${targets[$(((round + i) % 3))]}"
        run "$name" "$port" "$round"
    done
done

rss_mib() { awk '/^VmRSS:/ {printf "%.1f MiB", $2 / 1024}' "/proc/$1/status"; }

echo
echo "$ROUNDS rounds of wrk -t$THREADS -c$CONNS -d$DURATION --latency, $(nproc) cores, $(haproxy -v | head -n 1 | awk '{print "HAProxy " $3}')"
printf '%-6s %-10s %12s %10s %10s\n' "round" "target" "requests/s" "p50" "p99"
sort -k1,1n -k2,2 "$tmp/results" | awk '{printf "%-6s %-10s %12s %10s %10s\n", $1, $2, $3, $4, $5}'
# Per round, the ratios; then their median and range.
awk '{rps[$1, $2] = $3; rounds[$1] = 1} END {
    for (r in rounds) print rps[r, "shinyctl"] / rps[r, "haproxy"], rps[r, "shinyctl"] / rps[r, "direct"]
}' "$tmp/results" >"$tmp/ratios"
summary() { # column $1 of the ratios: median (min-max)
    cut -d' ' -f"$1" "$tmp/ratios" | sort -g | awk '{a[NR] = $1} END {
        m = (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2
        printf "%.2f (%.2f-%.2f)", m, a[1], a[NR]
    }'
}
echo "median (range) over the rounds: shinyctl/haproxy $(summary 1)   shinyctl/direct $(summary 2)"
echo "RSS after the load: shinyctl proxy $(rss_mib "$proxy_pid"), haproxy $(rss_mib "$haproxy_pid")"
