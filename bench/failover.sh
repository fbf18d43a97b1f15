#!/usr/bin/env bash
# A SIGKILL of the visitor's copy under a request every 10 ms: the example
# hello app (examples/hello/app.R, real R), one active copy and one warm
# spare, as the daemon runs it. One visitor sends GET / every 10 ms on a new
# connection, with its sticky cookie (and takes a new one when given, as a
# browser does). Each round waits until both copies are ready, takes one
# second of requests as the baseline (those answered before the kill), SIGKILLs the R process of the copy
# the visitor's cookie names, and keeps sending for WINDOW seconds more.
# Prints, per kill and overall: requests failed (anything but a whole
# 200), the p50 and the worst time of the requests in flight at the kill
# or sent after it, beside the baseline's, and what the kill added to its
# worst request (that worst less the baseline's p50: on a loaded machine
# R's own time moves more than a failover costs) with when that worst
# request was sent (ms after the kill; negative: it was in flight at the
# kill), and the request in
# flight at the kill: how long it had run on the killed copy and how long
# it took after the kill (the failover itself: the load balancer sees the
# copy end and sends it to the spare, whose whole answer it waits for).
# And, from the load balancer's own lines in api.log, when it saw each
# killed process end and when it sent the request in flight again, in ms
# after the kill: shinyctl's part of that request's time; the rest is R's
# (its time on the killed copy and the spare's whole answer).
# Fails when a request failed, or when the log shows none of the deaths.
#
#   bench/failover.sh                  # 5 kills, release build
#   ROUNDS=10 bench/failover.sh
#   BENCH_SHORT=1 bench/failover.sh    # 1 kill, a debug build
#
# Needs: cargo, R with shiny, python3. Uses its own SHINYCTL_HOME and free
# ports; everything it starts is stopped by PID on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/rig.sh
ROUNDS=${ROUNDS:-$(pick 1 5)}
WINDOW=${WINDOW:-2}

bench_build
mkdir -p "$tmp/app"
cp examples/hello/app.R "$tmp/app/"
port=$(free_port)
printf 'app-name: failover\nport: %s\nhost: 127.0.0.1\nreplicas: 1\nwarm-replicas: 1\nidle-timeout: 0\n' "$port" >"$tmp/app/app.yaml"
bench_apply "$tmp/app/app.yaml"
wait_copies failover 2

python3 - "$bin" "$port" "$ROUNDS" "$WINDOW" "$(nproc)" "$(basename "$(dirname "$bin")")" "$SHINYCTL_HOME/api.log" <<'PY'
import datetime, json, os, re, socket, subprocess, sys, threading, time

binary, port, rounds, window = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
cores, build, api_log = sys.argv[5], sys.argv[6], sys.argv[7]
cookie_re = re.compile(rb"(?im)^set-cookie:\s*(lb_%d=(\d+)\.[0-9a-f]+)" % port)

def get(cookie):
    """GET / on a new connection: (status, the Set-Cookie pair or None); status 0 when none came."""
    head = b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
    if cookie:
        head += b"Cookie: " + cookie + b"\r\n"
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as c:
            c.settimeout(30)
            c.sendall(head + b"\r\n")
            got = b""
            while True:
                chunk = c.recv(65536)
                if not chunk:
                    break
                got += chunk
    except OSError:
        return 0, None
    if not got.startswith(b"HTTP/1.1 "):
        return 0, None
    status = int(got[9:12])
    head, _, body = got.partition(b"\r\n\r\n")
    if status == 200 and b"</html>" not in body:
        status = 0  # cut short
    m = cookie_re.search(head)
    return status, (m.group(1) if m else None)

samples = []  # (sent at, ms, status, copy the cookie names after it)
stop = threading.Event()
visitor = {"cookie": None}

def visit():
    while not stop.is_set():
        t0 = time.perf_counter()
        status, new = get(visitor["cookie"])
        ms = (time.perf_counter() - t0) * 1000
        if new:
            visitor["cookie"] = new
        copy = int(visitor["cookie"].split(b"=")[1].split(b".")[0]) if visitor["cookie"] else 0
        samples.append((t0, ms, status, copy))
        time.sleep(0.01)

def status():
    out = subprocess.run([binary, "status", "--json"], capture_output=True, check=True).stdout
    return [a for a in json.loads(out)["apps"] if a["name"] == "failover"][0]["copies"]

def both_ready(copy):
    """Until two copies are ready and the visitor's is one of them; its R pid."""
    end = time.time() + 120
    while time.time() < end:
        c = status()
        ready = [x for x in c if x["ready"] and x["pid"]]
        mine = [x["pid"] for x in ready if x["copy"] == copy]
        if len(ready) >= 2 and mine:
            return mine[0]
        time.sleep(0.1)
    sys.exit("bench/failover.sh: the app never had two ready copies again: %r" % status())

thread = threading.Thread(target=visit, daemon=True)
thread.start()
while not samples or samples[-1][3] == 0:
    time.sleep(0.05)
kills = []
for r in range(rounds):
    copy = samples[-1][3]
    pid = both_ready(copy)
    time.sleep(1.0)
    copy = samples[-1][3]
    pid = both_ready(copy)
    at, wall = time.perf_counter(), time.time()
    os.kill(pid, 9)
    kills.append((at, copy, pid, wall))
    time.sleep(window)
stop.set()
thread.join()

print(f"failover: hello app (R), 1 active + 1 warm copy, a request every 10 ms on a new connection, sticky; "
      f"{rounds} SIGKILLs of the visitor's copy; {cores} cores, {build} build")
def log_time(line):
    """The Unix time of an api.log line (its first word, RFC 3339 in UTC)."""
    stamp = line.split(" ", 1)[0].rstrip("Z")
    return datetime.datetime.fromisoformat(stamp).replace(tzinfo=datetime.timezone.utc).timestamp()

# The load balancer's side of each kill, from its lines in api.log: when it
# saw the killed process end (a thread of R's ended with the process), and
# when it sent the request in flight again (none when no request was).
with open(api_log, errors="replace") as f:
    lines = f.read().splitlines()
def first_after(wall, pattern):
    """Ms from the kill to the first api.log line after it matching pattern, within the window."""
    for line in lines:
        if re.search(pattern, line):
            try:
                t = log_time(line)
            except ValueError:
                continue
            if wall - 0.005 <= t < wall + window:
                return (t - wall) * 1000
    return None
seen = [first_after(wall, r"process %d is ending" % pid) for _, _, pid, wall in kills]
resent = [first_after(wall, r"copy %d lost .*sending it once to another copy" % copy) for _, copy, _, wall in kills]
ms = lambda v: "-" if v is None else f"{v:+.1f}"

print(f"{'kill':<5} {'copy':>4} {'before: n':>10} {'p50 ms':>7} {'worst ms':>9} {'after: n':>9} {'failed':>7} {'p50 ms':>7} {'worst ms':>9} {'worst-p50':>10} {'sent at':>8} {'then on':>8} {'in flight: ran+after ms':>24} {'seen':>6} {'resent':>7}")
total_failed, worst_after, worst_before, excess, flight = 0, 0.0, 0.0, [], []
for i, (at, copy, _, _) in enumerate(kills, 1):
    before = [s for s in samples if at - 1.0 <= s[0] and s[0] + s[1] / 1000 < at]
    # A request sent up to its own length before the kill is in flight at it.
    after = [s for s in samples if at <= s[0] + s[1] / 1000 and s[0] < at + window]
    failed = sum(1 for s in after if s[2] != 200)
    wb = max((s[1] for s in before), default=0.0)
    wa = max((s[1] for s in after), default=0.0)
    # When the worst one was sent, in ms after the kill (negative: in flight).
    worst_at = max(after, key=lambda s: s[1])[0] - at if after else 0.0
    total_failed += failed
    worst_after, worst_before = max(worst_after, wa), max(worst_before, wb)
    then = after[-1][3] if after else 0
    p50 = sorted(s[1] for s in before)[len(before) // 2] if before else 0.0
    p50a = sorted(s[1] for s in after)[len(after) // 2] if after else 0.0
    # What the failover added to its worst request: beyond a typical one.
    excess.append(wa - p50)
    # The request sent before the kill and answered after it (none when the
    # kill fell between two requests): its time on the killed copy, and
    # from the kill to its answer.
    inflight = [s for s in after if s[0] < at]
    ran = ", ".join(f"{(at - s[0]) * 1000:.1f}+{s[1] - (at - s[0]) * 1000:.1f}" for s in inflight) or "none"
    flight.extend(s[1] - (at - s[0]) * 1000 for s in inflight)
    print(f"{i:<5} {copy:>4} {len(before):>10} {p50:>7.1f} {wb:>9.1f} {len(after):>9} {failed:>7} {p50a:>7.1f} {wa:>9.1f} {wa - p50:>10.1f} {worst_at * 1000:>+8.0f} {then:>8} {ran:>24} {ms(seen[i - 1]):>6} {ms(resent[i - 1]):>7}")
all_failed = sum(1 for s in samples if s[2] != 200)
excess.sort()
print(f"requests {len(samples)}, failed {all_failed}; worst after a kill {worst_after:.1f} ms "
      f"(worst of the seconds before the kills {worst_before:.1f} ms); "
      f"a kill's worst beyond the p50 before it: median {excess[len(excess) // 2]:.1f} ms, most {excess[-1]:.1f} ms")
if flight:
    flight.sort()
    print(f"the {len(flight)} request(s) in flight at a kill, from the kill to their answer: "
          f"median {flight[len(flight) // 2]:.1f} ms, most {flight[-1]:.1f} ms")
seen_ms = sorted(v for v in seen if v is not None)
resent_ms = sorted(v for v in resent if v is not None)
if seen_ms:
    print(f"the load balancer saw the killed process end {seen_ms[len(seen_ms) // 2]:.1f} ms after the kill at the median "
          f"(most {seen_ms[-1]:.1f})" + (f", and sent the request in flight again {resent_ms[len(resent_ms) // 2]:.1f} ms after it "
          f"(most {resent_ms[-1]:.1f}; {len(resent_ms)} request(s))" if resent_ms else ""))
if all_failed:
    sys.exit("bench/failover.sh: requests failed")
if not seen_ms:
    # The load balancer logs each death it sees; none found means this
    # script no longer reads api.log as the load balancer writes it.
    sys.exit(f"bench/failover.sh: api.log ({api_log}) shows the load balancer seeing none of the {len(kills)} deaths")
PY
