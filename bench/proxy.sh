#!/usr/bin/env bash
# Benchmarks shinyctl's load balancer against HAProxy, in one run with the
# same settings, as a user runs it: the daemon starts a small fast backend
# (examples/bench_backend.rs) as an app (its r-path a stand-in for R, see
# bench/rig.sh; the copy fenced as any copy is), and wrk is put straight at
# that copy's port ("direct"), through the load balancer the daemon started
# (sticky cookie, caps, retries: every feature on), and through HAProxy
# (mode http, sticky cookie inserted, `nbthread 2`) in front of the same
# copy. ROUNDS rounds, the three targets in turn within each and a
# different one first in each round, so a change in the machine's load
# falls on all of them. Prints requests/s, p50 and p99 latency of each
# round, each load balancer's CPU time per request answered (user and
# system, from /proc), the median and range of the ratios (requests/s,
# CPU per request, p99), and the resident memory of both load balancers
# after the load. Any non-2xx answer or socket error fails the run: a
# speed of errors is no speed.
#
#   bench/proxy.sh                    # 5 rounds of wrk -t2 -c32 -d10s --latency
#   ROUNDS=9 DURATION=30s CONNS=64 bench/proxy.sh
#   BENCH_SHORT=1 bench/proxy.sh      # one round of 1 s, a debug build
#
# Needs: cargo, wrk, haproxy, curl, python3. Uses its own SHINYCTL_HOME and
# free ports; everything it starts is stopped by PID on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/rig.sh

ROUNDS=${ROUNDS:-$(pick 1 5)}
DURATION=${DURATION:-$(pick 1s 10s)}
WARMUP=${WARMUP:-$(pick 0 2s)}
THREADS=${THREADS:-2}
CONNS=${CONNS:-32}

bash scripts/deps.sh wrk haproxy curl >/dev/null
for tool in wrk haproxy curl python3; do
    command -v "$tool" >/dev/null || { echo "bench/proxy.sh: $tool is not installed" >&2; exit 1; }
done
bench_build bench_backend

app_port=$(free_port)
fast_app fast "$app_port" 1 "host: 127.0.0.1
warm-replicas: 0
"
proxy_pid=$(status_py 'j["proxy_pid"]')

# HAProxy with as many threads as the load balancer's runtime, in front of
# the same copy, doing what shinyctl's load balancer does to every request
# (src/proxy/visitors/headers.rs): the visitor's address in X-Forwarded-For
# and X-Real-IP, X-Forwarded-Proto set, a visitor's own Forwarded,
# X-Forwarded-Host and X-Forwarded-Port dropped, a time limit on a
# request's head, a sticky cookie inserted with Cache-Control: private.
# (Both drop hop-by-hop headers; neither caps connections from loopback.)
haproxy_port=$(free_port)
cat >"$tmp/haproxy.cfg" <<EOF
global
    nbthread 2
    maxconn 4096
defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s
    timeout http-request 30s
frontend fe
    bind 127.0.0.1:$haproxy_port
    option forwardfor
    http-request set-header X-Real-IP %[src]
    http-request set-header X-Forwarded-Proto http
    http-request del-header Forwarded
    http-request del-header X-Forwarded-Host
    http-request del-header X-Forwarded-Port
    default_backend be
backend be
    cookie lb insert indirect nocache
    server copy1 127.0.0.1:$copy_port cookie 1
EOF
setsid haproxy -db -f "$tmp/haproxy.cfg" 2>"$tmp/haproxy.log" &
haproxy_pid=$!
pids+=("$haproxy_pid")
wait_port "$haproxy_port"

# Both must answer (and the load balancer set its cookie) before measuring.
curl -sfi "http://127.0.0.1:$app_port/" | grep -qi '^set-cookie: lb_' || {
    echo "bench/proxy.sh: shinyctl's load balancer does not answer with its cookie" >&2
    exit 1
}
curl -sf "http://127.0.0.1:$haproxy_port/" >/dev/null || { echo "bench/proxy.sh: haproxy does not answer" >&2; cat "$tmp/haproxy.log" >&2; exit 1; }

# CPU time (user + system, clock ticks) a process has used so far.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
ticks_per_s=$(getconf CLK_TCK)

run() { # one measurement of $1 on port $2, appended to $tmp/results
    local name=$1 port=$2 round=$3 out lb=${4:-} before=0 after=0
    if [ "$WARMUP" != 0 ]; then wrk -t"$THREADS" -c"$CONNS" -d"$WARMUP" "http://127.0.0.1:$port/" >/dev/null; fi
    [ -z "$lb" ] || before=$(cpu_ticks "$lb")
    out=$(wrk -t"$THREADS" -c"$CONNS" -d"$DURATION" --latency "http://127.0.0.1:$port/")
    [ -z "$lb" ] || after=$(cpu_ticks "$lb")
    if grep -q 'Non-2xx\|Socket errors' <<<"$out"; then
        echo "bench/proxy.sh: errors while measuring $name (round $round):" >&2
        grep 'Non-2xx\|Socket errors' <<<"$out" >&2
        exit 1
    fi
    local rps
    rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
    if ! awk -v r="$rps" 'BEGIN {exit !(r > 0)}'; then
        echo "bench/proxy.sh: no request answered while measuring $name (round $round):" >&2
        echo "$out" >&2
        exit 1
    fi
    # The load balancer's CPU per request answered, in microseconds: what
    # it costs the machine, a figure the machine's other load moves less
    # than requests/s ("-" for direct, where there is none).
    local requests cpu_us=-
    requests=$(awk '/requests in/ {print $1}' <<<"$out")
    [ -z "$lb" ] || cpu_us=$(awk -v t=$((after - before)) -v hz="$ticks_per_s" -v n="$requests" 'BEGIN {printf "%.1f", t / hz * 1e6 / n}')
    echo "$round $name $rps $(awk '$1 == "50%" {print $2}' <<<"$out") $(awk '$1 == "99%" {print $2}' <<<"$out") $cpu_us" >>"$tmp/results"
}
targets=("direct $copy_port" "shinyctl $app_port $proxy_pid" "haproxy $haproxy_port $haproxy_pid")
for round in $(seq 1 "$ROUNDS"); do
    for i in 0 1 2; do
        read -r name port lb <<<"${targets[$(((round + i) % 3))]}"
        run "$name" "$port" "$round" "$lb"
    done
done

rss_mib() { awk '/^VmRSS:/ {printf "%.1f MiB", $2 / 1024}' "/proc/$1/status"; }

echo "$ROUNDS rounds of wrk -t$THREADS -c$CONNS -d$DURATION --latency, $(nproc) cores, $(haproxy -v | head -n 1 | awk '{print "HAProxy " $3}'), $(basename "$(dirname "$bin")") build"
echo "the fast backend started by the daemon as an app (fenced); direct and HAProxy at its copy's port"
printf '%-6s %-10s %12s %10s %10s %12s\n' "round" "target" "requests/s" "p50" "p99" "LB CPU/req"
sort -k1,1n -k2,2 "$tmp/results" | awk '{printf "%-6s %-10s %12s %10s %10s %12s\n", $1, $2, $3, $4, $5, ($6 == "-") ? "-" : $6 " us"}'
# Per round, the ratios; then their median and range.
awk 'function us(t) { # a latency as wrk prints it (588.00us, 1.57ms, 2.00s) in microseconds
        if (t ~ /us$/) return t + 0
        if (t ~ /ms$/) return t * 1000
        return t * 1000000
    }
    {rps[$1, $2] = $3; p99[$1, $2] = us($5); cpu[$1, $2] = $6; rounds[$1] = 1} END {
    for (r in rounds) print rps[r, "shinyctl"] / rps[r, "haproxy"], rps[r, "shinyctl"] / rps[r, "direct"], (cpu[r, "haproxy"] > 0) ? cpu[r, "shinyctl"] / cpu[r, "haproxy"] : 0, p99[r, "shinyctl"] / p99[r, "haproxy"]
}' "$tmp/results" >"$tmp/ratios"
summary() { # column $1 of the ratios: median (min-max)
    cut -d' ' -f"$1" "$tmp/ratios" | sort -g | awk '{a[NR] = $1} END {
        m = (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2
        printf "%.2f (%.2f-%.2f)", m, a[1], a[NR]
    }'
}
echo "median (range) over the rounds: shinyctl/haproxy $(summary 1)   shinyctl/direct $(summary 2)"
echo "load balancer CPU per request, shinyctl/haproxy (lower is better): $(summary 3)"
echo "p99 latency, shinyctl/haproxy (lower is better): $(summary 4)"
echo "RSS after the load: shinyctl's load balancer $(rss_mib "$proxy_pid"), haproxy $(rss_mib "$haproxy_pid")"
