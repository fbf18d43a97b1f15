#!/usr/bin/env bash
# A copy's start until its port answers HTTP, three ways in alternating
# rounds, in one run: R started directly (no launcher at all), through
# `shinyctl launch` unfenced (`sandbox.mode: off`: the launcher execs R as a
# plain process) and fenced (`mode: on`: user, mount, PID, IPC and UTS
# namespaces, the init as PID 1, the new root). Prints the median of each,
# the differences, and every run. R's own start (1-3 s, noisy on a busy
# machine) hides a few ms, so the launcher alone is timed too: ALONE rounds
# each with /bin/true as the r-path, from the launcher's start to its exit
# (fenced: the clone, the new root, the init, the exec of R and R's end
# reported back).
#
#   bench/fence.sh               # 10 rounds, release build
#   RUNS=20 BIN=target/debug/shinyctl bench/fence.sh
#   BENCH_SHORT=1 bench/fence.sh # 1 round, 3 of the launcher alone, a debug build
#   BASE=/tmp/shinyctl-before bench/fence.sh   # also another build, fenced
#
# With BASE, another build of shinyctl is timed fenced beside this one, in
# the same rounds: what a change to the fence costs.
#
# R's front script alone too: ALONE times with /bin/true as its R, the
# run expression given as `-e` and as the launcher gives it (on standard
# input): what a copy's start saves by not using `-e`.
#
# Then the disk: write throughput (dd of WRITE_MIB MiB, 256 by default,
# conv=fsync, median of 3) to the copy's disk of its own (under root the
# fenced launcher made its scratch an ext4 in a sparse image on a loop
# device; `sandbox.disk`, 1G) beside the host's disk that holds the image,
# and what the image takes of the host's disk when empty. Not root: the
# copy writes to the host's disk, so only the host's figure is printed.
#
# Then a request through the load balancer, fenced against `mode: off`:
# the hello app twice in one daemon, GET / in turn (REQS each, 200 by
# default), p50 and p90 of each.
#
# The launcher is run here as the daemon runs it (`shinyctl launch`, the
# same arguments), not through the daemon: the daemon's readiness poll
# (every 100 ms) would hide what is measured. Uses a temporary folder and a
# free port; every process it starts is ended by PID (SIGTERM, which the
# fenced launcher forwards to R) before the next one starts.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/rig.sh
RUNS=${RUNS:-$(pick 1 10)}
WRITE_MIB=${WRITE_MIB:-$(pick 32 256)}
ALONE=${ALONE:-$(pick 3 50)}
bench_build
mkdir -p "$tmp/home/scratch/bench-app/1" "$tmp/app"
cp examples/hello/app.R "$tmp/app/"

base=${BASE:+$(realpath "$BASE")}

python3 - "$bin" "$tmp" "$RUNS" "$ALONE" "$base" "$WRITE_MIB" <<'PY'
import json, os, socket, statistics, subprocess, sys, time
bin, tmp, runs, alone, base = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
write_mib = int(sys.argv[6])
home, app = f"{tmp}/home", f"{tmp}/app"
scratch = f"{home}/scratch/bench-app/1"
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()

def answers():
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as c:
            c.sendall(b"GET / HTTP/1.0\r\n\r\n")
            return c.recv(5).startswith(b"HTTP/")
    except OSError:
        return False

def launch(mode, r_path, binary=bin):
    spec = {"app": "bench-app", "copy": 1, "port": port, "app_dir": app, "scratch": scratch,
            "start": {"working_dir": app, "entrypoint": "app.R", "r_path": r_path, "env": {},
                      "sandbox": {"mode": mode}}}
    return [binary, "launch", "--home", home, "--spec", json.dumps(spec)]

expr = f"shiny::runApp(appDir = '{app}/app.R', port = {port}L, host = '127.0.0.1', launch.browser = FALSE)"
# R started as the launcher starts it (src/launcher/mod.rs, R_ARGS): the
# expression on its standard input.
R_ARGS = ["--no-echo", "--no-restore", "--no-save"]
commands = {
    "direct": ["R", *R_ARGS],
    "off": launch("off", "R"),
    "on": launch("on", "R"),
}
if base:
    commands["base"] = launch("on", "R", base)

rtmp = f"{tmp}/rtmp"
os.makedirs(rtmp, exist_ok=True)

def holding(text):
    """A pipe's reading end that holds `text` whole, its writing end closed."""
    r, w = os.pipe()
    os.write(w, text.encode())
    os.close(w)
    return r

def start(mode):
    cmd = commands[mode]
    t0 = time.perf_counter()
    given = holding(expr + "\n") if mode == "direct" else subprocess.DEVNULL
    env = dict(os.environ, SHINYCTL_COPY="1", SHINYCTL_SCRATCH=scratch)
    if mode in ("direct", "off"):
        # R's tempdir() in the bench's own folder (a fenced copy has a /tmp
        # of its own): R ended by a signal leaves it, and the bench removes
        # that folder when it ends.
        env["TMPDIR"] = rtmp
    p = subprocess.Popen(cmd, cwd=app, stdin=given, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                         env=env)
    if mode == "direct":
        os.close(given)
    deadline = t0 + 60
    while not answers():
        if p.poll() is not None or time.perf_counter() > deadline:
            p.kill(); p.wait(); sys.exit(f"no answer from the {mode} copy (exit {p.returncode})")
        time.sleep(0.005)
    ms = (time.perf_counter() - t0) * 1000
    p.terminate(); p.wait()
    while answers():
        time.sleep(0.005)
    return ms

def launcher_alone(mode, binary=bin):
    cmd = launch(mode, "/bin/true", binary)
    t0 = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return (time.perf_counter() - t0) * 1000

# R's front script (`R` on PATH, a shell script that sets R's variables and
# execs R's binary) alone: a copy of it whose binary is /bin/true, given
# the run expression as `-e` (R's usual way, the launcher's before) and as
# the launcher gives it now (on standard input), in turn.
front = subprocess.run(["sh", "-c", "command -v R"], capture_output=True, text=True).stdout.strip()
binary_line = 'R_binary="${R_HOME}/bin/exec${R_ARCH}/R"'
script = open(front).read() if front and os.path.isfile(front) else ""
if binary_line in script:
    fake = f"{tmp}/R-front"
    with open(fake, "w") as f:
        f.write(script.replace(binary_line, 'R_binary=/bin/true'))
    os.chmod(fake, 0o755)
    def front_alone(args, text):
        given = holding(text) if text else subprocess.DEVNULL
        t0 = time.perf_counter()
        subprocess.run([fake, *args], stdin=given, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        ms = (time.perf_counter() - t0) * 1000
        if text:
            os.close(given)
        return ms
    fe, fs = [], []
    for _ in range(alone):
        fe.append(front_alone(["--no-echo", "--no-restore", "-e", expr], None))
        fs.append(front_alone(R_ARGS, expr + "\n"))
    me, ms_ = statistics.median(fe), statistics.median(fs)
    print(f"R's front script ({front}) alone, its R /bin/true, median of {alone}: "
          f"the expression as -e {me:.1f} ms, on standard input {ms_:.1f} ms ({ms_ - me:+.1f} ms)")
else:
    print(f"(R on PATH, {front or 'none'}, is not R's front script: its time alone is not measured)")

ao, af = [], []
for _ in range(alone):
    ao.append(launcher_alone("off")); af.append(launcher_alone("on"))
mo, mf = statistics.median(ao), statistics.median(af)
print(f"the launcher alone (r-path /bin/true), median of {alone}: unfenced {mo:.1f} ms, fenced {mf:.1f} ms ({mf - mo:+.1f} ms)")
if base:
    ab, an = [], []
    for _ in range(alone):
        ab.append(launcher_alone("on", base)); an.append(launcher_alone("on"))
    mb, mn = statistics.median(ab), statistics.median(an)
    print(f"the launcher alone fenced, median of {alone}: BASE {mb:.1f} ms, this build {mn:.1f} ms ({mn - mb:+.1f} ms)")

times = {mode: [] for mode in commands}
for _ in range(runs):
    for mode in commands:
        times[mode].append(start(mode))
m = {mode: statistics.median(t) for mode, t in times.items()}
print(f"copy start until its port answers, median of {runs}: R directly {m['direct']:.0f} ms, "
      f"through the launcher unfenced {m['off']:.0f} ms ({m['off'] - m['direct']:+.0f} ms), "
      f"fenced {m['on']:.0f} ms ({m['on'] - m['direct']:+.0f} ms)")
if base:
    print(f"fenced, BASE {m['base']:.0f} ms, this build {m['on']:.0f} ms ({m['on'] - m['base']:+.0f} ms)")
for mode, label in [("direct", "R directly:"), ("off", "unfenced:  "), ("on", "fenced:    "), ("base", "BASE:      ")]:
    if mode in times:
        print(label, " ".join(f"{x:.0f}" for x in times[mode]))

def write_rate(folder):
    """MiB/s of a dd of write_mib MiB with an fsync, median of 3."""
    rates = []
    for _ in range(3):
        target = os.path.join(folder, "bench-dd")
        t0 = time.perf_counter()
        subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=1M", f"count={write_mib}", "conv=fsync", "status=none"], check=True)
        rates.append(write_mib / (time.perf_counter() - t0))
        os.remove(target)
    return statistics.median(rates)

host_rate = write_rate(tmp)
if os.path.ismount(scratch):
    image = scratch + ".img"
    empty_kib = os.stat(image).st_blocks // 2
    own_rate = write_rate(scratch)
    print(f"disk writes ({write_mib} MiB, conv=fsync, median of 3): the copy's own disk {own_rate:.0f} MiB/s, "
          f"the host's {host_rate:.0f} MiB/s ({(own_rate / host_rate - 1) * 100:+.0f}%); "
          f"before them its 1G image took {empty_kib} KiB of the host's disk")
else:
    print(f"disk writes ({write_mib} MiB, conv=fsync, median of 3): the host's {host_rate:.0f} MiB/s; "
          f"the copy has no disk of its own here (not root: the daemon watches sandbox.disk)")
PY

# Then a request through the load balancer, fenced against `mode: off`: the
# hello app twice in one daemon (one copy each, never asleep), GET / on a
# new connection to each app's port in turn, REQS times each.
REQS=${REQS:-$(pick 5 200)}
export SHINYCTL_HOME=$tmp/lbhome
homes+=("$SHINYCTL_HOME")
fenced_port=$(free_port)
off_port=$(free_port)
for app in fenced off; do
    mkdir -p "$tmp/$app"
    cp examples/hello/app.R "$tmp/$app/"
done
printf 'app-name: fenced\nport: %s\nhost: 127.0.0.1\nwarm-replicas: 0\nidle-timeout: 0\n' "$fenced_port" >"$tmp/fenced/app.yaml"
printf 'app-name: off\nport: %s\nhost: 127.0.0.1\nwarm-replicas: 0\nidle-timeout: 0\nsandbox:\n  mode: off\n' "$off_port" >"$tmp/off/app.yaml"
bench_apply "$tmp/fenced/app.yaml"
bench_apply "$tmp/off/app.yaml"
wait_copies fenced 1
wait_copies off 1
python3 - "$REQS" "$fenced_port" "$off_port" <<'PY'
import http.client, statistics, sys, time
reqs, ports = int(sys.argv[1]), {"fenced": int(sys.argv[2]), "off": int(sys.argv[3])}
times = {k: [] for k in ports}
def get(port):
    t0 = time.perf_counter()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/")
    r = c.getresponse()
    r.read()
    c.close()
    if r.status != 200:
        sys.exit(f"bench/fence.sh: GET / on {port} answered {r.status}")
    return (time.perf_counter() - t0) * 1000
for port in ports.values():
    get(port)  # each copy's first page, before the timed ones
for i in range(reqs):
    order = list(ports) if i % 2 == 0 else list(reversed(list(ports)))
    for k in order:
        times[k].append(get(ports[k]))
def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]
p50 = {k: statistics.median(v) for k, v in times.items()}
print(f"GET / through the load balancer, new connection each, {reqs} each in turn: "
      f"fenced p50 {p50['fenced']:.1f} ms p90 {pct(times['fenced'], 0.9):.1f} ms, "
      f"mode off p50 {p50['off']:.1f} ms p90 {pct(times['off'], 0.9):.1f} ms (fenced/off p50 {p50['fenced'] / p50['off']:.2f})")
PY
