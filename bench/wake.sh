#!/usr/bin/env bash
# A sleeping app's wake beside R's own cold start, in one run: the example
# hello app (examples/hello/app.R), one copy, asleep after 1 s idle, as two
# apps of one daemon: `wake`, whose copy is claimed from the pool (a fork of
# the zygote, an R that has loaded shiny), and `wakecold` (`pool: false`),
# whose copy starts R cold. A GET of / sent to the load balancer while the
# app sleeps, timed from the connect to the whole 200 (the request is held
# while the daemon starts the copy: launcher, claim or R, fence, shiny,
# readiness, the table pushed); and R started directly (`R --no-echo
# --no-restore --no-save` with `shiny::runApp(...)` on its standard input,
# as the launcher starts it, no launcher, no fence) until its port answers
# 200. ROUNDS rounds, a different one first in each; prints the median,
# the range and every sample of each, and the differences of the medians.
# A pool wake whose copy was not claimed fails the bench.
#
# Then each wake's steps side by side, cold and with the pool (medians, ms
# since the load balancer first held the request): the daemon told, its
# cycle ending the sleep, the launcher forked, R listening (the copy's
# init says so), the daemon seeing the copy ready, the table pushed, the
# held request sent to the copy, the copy's answer. They come from two
# lines of api.log: the daemon's `APP woke in N ms: …` (with `asked_ms`)
# and the load balancer's `a request held for the wake of APP: …` (with
# `held_ms`); a wake without both fails the bench. Then R's listen from
# its start, the cold copy's (from its launcher's fork: the launcher and
# the fence) beside R alone's (from its spawn: the first connection its
# port accepted). Last, what shinyctl adds to each cold wake: its time
# less its own R's (R started to R listening, and R's answer to the held
# request), each round and the most.
#
#   bench/wake.sh                    # 10 rounds, release build
#   BENCH_SHORT=1 bench/wake.sh      # 1 round, a debug build
#
# Needs: cargo, R with shiny, python3. Uses its own SHINYCTL_HOME and free
# ports; everything it starts is stopped by PID on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/rig.sh
ROUNDS=${ROUNDS:-$(pick 1 10)}

bench_build
mkdir -p "$tmp/app"
cp examples/hello/app.R "$tmp/app/"
mkdir -p "$tmp/cold"
cp examples/hello/app.R "$tmp/cold/"
port=$(free_port)
cold_port=$(free_port)
printf 'app-name: wake\nport: %s\nhost: 127.0.0.1\nwarm-replicas: 0\nidle-timeout: 1s\n' "$port" >"$tmp/app/app.yaml"
printf 'app-name: wakecold\nport: %s\nhost: 127.0.0.1\nwarm-replicas: 0\nidle-timeout: 1s\npool: false\n' "$cold_port" >"$tmp/cold/app.yaml"
bench_apply "$tmp/app/app.yaml"
bench_apply "$tmp/cold/app.yaml"

# Until app $1 is asleep and its R process gone, and (for the pool's wake)
# the pool's zygote takes claims (60 s).
wait_asleep() {
    local end=$((SECONDS + 60))
    while [ "$SECONDS" -lt "$end" ]; do
        if "$bin" status --json | python3 -c 'import json,sys
j = json.load(sys.stdin)
c = [a for a in j["apps"] if a["name"] == sys.argv[1]][0]["copies"]
z = (j.get("pool") or {}).get("zygotes") or []
sys.exit(0 if c and all(x["status"] == "asleep" and not x["pid"] for x in c) and any(x["ready"] for x in z) else 1)' "$1"; then
            return 0
        fi
        sleep 0.1
    done
    echo "bench/wake.sh: $1 did not fall asleep within 60 s (or the pool is not ready)" >&2
    "$bin" status >&2 || true
    exit 1
}

# How app $1's copy started (status: claimed from the pool, or cold and why).
start_of() {
    "$bin" status --json | python3 -c 'import json,sys
a = [a for a in json.load(sys.stdin)["apps"] if a["name"] == sys.argv[1]][0]
print(((a["copies"][0].get("isolation") or {}).get("start")) or "")' "$1"
}

# The two measures, in python for a clock finer than the shell's loops;
# each prints milliseconds, or fails.
measure() {
    python3 - "$@" <<'PY'
import os, signal, socket, subprocess, sys, time

connected = []  # when a connection was first accepted: R listens

def get_status(port, timeout):
    """The status of a GET / on a new connection, read to its end; 0 if none."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as c:
            connected.append(time.perf_counter())
            c.settimeout(timeout)
            c.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            got = b""
            while True:
                chunk = c.recv(65536)
                if not chunk:
                    break
                got += chunk
            return int(got.split(b" ", 2)[1]) if got.startswith(b"HTTP/") else 0
    except (OSError, ValueError, IndexError):
        return 0

what, port = sys.argv[1], int(sys.argv[2])
# The first address look-up of a process loads the C library's name
# service modules (1.5-2 ms here, measured): done before any clock starts,
# so no sample carries it.
socket.getaddrinfo("127.0.0.1", port, type=socket.SOCK_STREAM)
if what == "wake":
    t0 = time.perf_counter()
    status = get_status(port, 60)
    ms = (time.perf_counter() - t0) * 1000
    if status != 200:
        sys.exit(f"bench/wake.sh: the waking request got {status or 'no answer'}")
    print(f"{ms:.0f}")
else:
    app = sys.argv[3]
    expr = f"shiny::runApp(appDir = '{app}', port = {port}L, host = '127.0.0.1', launch.browser = FALSE)"
    t0 = time.perf_counter()
    # As the launcher starts R (src/launcher/mod.rs, R_ARGS): the
    # expression on R's standard input, a pipe that holds it whole.
    given, w = os.pipe()
    os.write(w, (expr + "\n").encode())
    os.close(w)
    # R's tempdir() in the bench's own folder: R ended by a signal leaves
    # it, and the bench removes that folder when it ends.
    rtmp = os.path.join(os.path.dirname(app), "rtmp")
    os.makedirs(rtmp, exist_ok=True)
    p = subprocess.Popen(["R", "--no-echo", "--no-restore", "--no-save"], cwd=app, stdin=given,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                         env=dict(os.environ, TMPDIR=rtmp))
    os.close(given)
    try:
        while get_status(port, 2) != 200:
            if p.poll() is not None or time.perf_counter() - t0 > 60:
                sys.exit(f"bench/wake.sh: R did not answer 200 on port {port} (exit {p.poll()})")
            time.sleep(0.005)
        ms = (time.perf_counter() - t0) * 1000
    finally:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait()
    print(f"{ms:.0f} {(connected[0] - t0) * 1000:.0f}")
PY
}

# The steps of app $1's last wake, from the two lines of api.log, as one
# JSON line: each step's ms since the load balancer first held the request.
steps_of() {
    python3 - "$1" "$SHINYCTL_HOME/api.log" <<'PY'
import json, re, sys
app, log = sys.argv[1], open(sys.argv[2]).read()
woke = re.findall(r"woke in \d+ ms: (.*?) app=\"?%s\"? asked_ms=(\d+)" % re.escape(app), log)
held = re.findall(r"a request held for the wake of %s: sent to copy \d+ \+(\d+) ms, answered (\d+) \+(\d+).*? held_ms=(\d+)" % re.escape(app), log)
if not woke or not held:
    sys.exit(f"bench/wake.sh: no wake steps of {app} in api.log")
(said, asked), (sent, status, answered, held_ms) = woke[-1], held[-1]
base = int(asked) - int(held_ms)
steps = {"daemon told": base}
for part in said.split(", "):
    name, at = re.match(r"(.*) \+(\d+)", part).groups()
    steps[name] = base + int(at)
steps["request sent to the copy"] = int(sent)
steps["the copy's answer (head)"] = int(answered)
print(json.dumps(steps))
PY
}

: >"$tmp/pool.ms"
: >"$tmp/cold.ms"
: >"$tmp/r.ms"
: >"$tmp/r.listen"
: >"$tmp/pool.steps"
: >"$tmp/cold.steps"
r_port=$(free_port)
orders=("pool cold r" "cold r pool" "r pool cold")
for round in $(seq 1 "$ROUNDS"); do
    for what in ${orders[$((round % 3))]}; do
        case "$what" in
        pool)
            wait_asleep wake
            measure wake "$port" >>"$tmp/pool.ms"
            steps_of wake >>"$tmp/pool.steps"
            how=$(start_of wake)
            case "$how" in claimed*) ;; *)
                echo "bench/wake.sh: the pool's wake was not claimed: $how" >&2
                exit 1
                ;;
            esac
            ;;
        cold)
            wait_asleep wakecold
            measure wake "$cold_port" >>"$tmp/cold.ms"
            steps_of wakecold >>"$tmp/cold.steps"
            ;;
        r)
            read -r ms listen < <(measure r "$r_port" "$tmp/app") || true
            [ -n "${listen:-}" ] || exit 1 # measure said why
            echo "$ms" >>"$tmp/r.ms"
            echo "$listen" >>"$tmp/r.listen"
            ;;
        esac
    done
done

line() { # NAME FILE: median (min-max), then every sample
    printf '%-34s %6s ms (%s-%s)   each: %s\n' "$1" "$(median <"$2")" "$(sort -n "$2" | head -1)" "$(sort -n "$2" | tail -1)" "$(paste -sd' ' "$2")"
}
echo "hello app, $ROUNDS alternating rounds, $(nproc) cores, $(basename "$(dirname "$bin")") build; median (range)"
line "asleep, the pool: request to 200" "$tmp/pool.ms"
line "asleep, cold: request to 200" "$tmp/cold.ms"
line "R's own cold start to its first 200" "$tmp/r.ms"
awk -v p="$(median <"$tmp/pool.ms")" -v w="$(median <"$tmp/cold.ms")" -v r="$(median <"$tmp/r.ms")" \
    'BEGIN {printf "against R'"'"'s own start (medians): the pool %+.0f ms, a cold wake %+.0f ms\n", p - r, w - r}'
echo "the steps of a wake, ms since the load balancer held the request (medians):"
python3 - "$tmp/cold.steps" "$tmp/pool.steps" "$(median <"$tmp/cold.ms")" "$(median <"$tmp/pool.ms")" "$(median <"$tmp/r.ms")" "$(median <"$tmp/r.listen")" "$tmp/cold.ms" "$tmp/r.listen" <<'PY'
import json, statistics, sys
runs = [[json.loads(l) for l in open(f) if l.strip()] for f in sys.argv[1:3]]
cold_ms = [float(l) for l in open(sys.argv[7]) if l.strip()]
alone_listen = [float(l) for l in open(sys.argv[8]) if l.strip()]
order = ["daemon told", "cycle", "launcher forked", "R started", "R listening", "ready seen", "table pushed",
         "request sent to the copy", "the copy's answer (head)"]
def med(rs, k):
    xs = [r[k] for r in rs if k in r]
    return f"{statistics.median(xs):.0f}" if xs else "-"
print(f"  {'step':<34} {'cold':>6} {'pool':>6}")
for k in order:
    print(f"  {k:<34} {med(runs[0], k):>6} {med(runs[1], k):>6}")
print(f"  {'200 whole, at the client':<34} {sys.argv[3]:>6} {sys.argv[4]:>6}")
print(f"  {'R alone, to its first 200':<34} {sys.argv[5]:>6}")
# The fence's and the launcher's cost to R's start: R's listen from the
# launcher's fork (cold) beside R alone's from its spawn.
fenced = [r["R listening"] - r["launcher forked"] for r in runs[0] if "R listening" in r and "launcher forked" in r]
if fenced:
    print(f"  {'R listening, from its start':<34} {statistics.median(fenced):>6.0f}   (cold: from the launcher's fork;"
          f" R alone: {float(sys.argv[6]):.0f}, from its spawn)")
# What shinyctl itself adds to each cold wake, told apart from R's own time
# in that same wake (R's start, from its exec to its listen, and its answer
# to the held request): R's start moves by tens of ms from one round to
# the next, so a wake set beside another R's start cannot show a 20 ms
# part for sure; set beside its own R's, it can.
own, r_start, parts = [], [], []
for steps, total in zip(runs[0], cold_ms):
    if all(k in steps for k in ("R started", "R listening", "request sent to the copy", "the copy's answer (head)")):
        r_own = (steps["R listening"] - steps["R started"]) + (steps["the copy's answer (head)"] - steps["request sent to the copy"])
        own.append(total - r_own)
        r_start.append(steps["R listening"] - steps["R started"])
        # Its parts: to R's start, from R's listen to the request sent, and
        # from the answer's head to the whole 200 at the client.
        parts.append((steps["R started"], steps["request sent to the copy"] - steps["R listening"],
                      total - steps["the copy's answer (head)"]))
if own:
    print(f"a cold wake less its R's own time (R started to R listening, and R's answer): "
          f"median {statistics.median(own):.0f} ms, most {max(own):.0f}   each: {' '.join(f'{x:.0f}' for x in own)}")
    print("  its parts, each round: to R's start / R listening to the request sent / the answer's head to the whole 200: "
          + "  ".join(f"{a:.0f}/{b:.0f}/{c:.0f}" for a, b, c in parts))
    print(f"R's start, exec to listen: in the fence {statistics.median(r_start):.0f} ms (median), "
          f"alone {statistics.median(alone_listen):.0f} (spawn to its first connection)")
else:
    sys.exit("bench/wake.sh: no cold wake said when its R started and listened")
PY
