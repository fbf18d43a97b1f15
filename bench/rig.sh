# Sourced by bench/proxy.sh and bench/hostile.sh: a folder of the run's own
# ($tmp) and the processes to stop on exit (the array pids), removed and
# stopped on exit; then, with start_rig, the fast backend and `shinyctl
# proxy` in front of it, with a one-copy table pushed over its socket.
# Expects BACKEND_PORT and PROXY_PORT; start_rig sets backend_pid, proxy_pid
# and home. The proxy's log is $tmp/proxy.log.

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

wait_port() {
    for _ in $(seq 1 100); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
        sleep 0.05
    done
    echo "$0: nothing listens on port $1" >&2
    exit 1
}

# start_rig HOST: the backend, then the proxy listening on HOST:PROXY_PORT.
start_rig() {
    target/release/examples/bench_backend "$BACKEND_PORT" &
    backend_pid=$!
    pids+=("$backend_pid")
    wait_port "$BACKEND_PORT"

    home="$tmp/home"
    mkdir -m 700 "$home" "$home/proxy"
    # The cookie key, as the daemon makes it (the load balancer only reads it).
    (umask 077 && head -c 32 /dev/urandom >"$home/proxy/cookie.key")
    SHINYCTL_HOME="$home" target/release/shinyctl proxy 2>"$tmp/proxy.log" &
    proxy_pid=$!
    pids+=("$proxy_pid")
    for _ in $(seq 1 100); do [ -S "$home/proxy/proxy.sock" ] && break; sleep 0.05; done
    cat >"$tmp/table.json" <<JSON
{"apps":[{"name":"bench","host":"$1","port":$PROXY_PORT,"policy":"least-conn","request_timeout_ms":30000,
  "copies":[{"copy":1,"port":$BACKEND_PORT,"role":"active","pid":$backend_pid}]}]}
JSON
    curl -sf --unix-socket "$home/proxy/proxy.sock" -X PUT http://shinyctl/table --data-binary @"$tmp/table.json" >/dev/null
    wait_port "$PROXY_PORT"
}
