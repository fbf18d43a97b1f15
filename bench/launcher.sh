#!/usr/bin/env bash
# A copy's start until its port answers HTTP, with R started directly (as
# before the launcher) and through `shinyctl launch` (its own mount
# namespace, then exec R), alternating, in one run. Prints the median of
# each and every run.
#
#   bench/launcher.sh               # 10 runs each, release build
#   RUNS=20 BIN=target/debug/shinyctl bench/launcher.sh
#
# Uses a temporary folder and a free port; every process it starts is ended
# by PID before the next one starts.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-10}
if [ -z "${BIN:-}" ]; then
    cargo build --release --bin shinyctl 2>/dev/null
    BIN=target/release/shinyctl
fi
bin=$(realpath "$BIN")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/app" "$tmp/scratch/bench-app/1"
cp examples/hello/app.R "$tmp/app/"

python3 - "$bin" "$tmp" "$RUNS" <<'PY'
import os, socket, statistics, subprocess, sys, time
bin, tmp, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
app, scratch = f"{tmp}/app", f"{tmp}/scratch/bench-app/1"
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()

def answers():
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as c:
            c.sendall(b"GET / HTTP/1.0\r\n\r\n")
            return c.recv(5).startswith(b"HTTP/")
    except OSError:
        return False

def start(cmd):
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, cwd=app, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         env=dict(os.environ, SHINYCTL_SCRATCH=scratch, SHINYCTL_COPY="1"))
    deadline = t0 + 60
    while not answers():
        if p.poll() is not None or time.perf_counter() > deadline:
            p.kill(); p.wait(); sys.exit(f"no answer from {cmd[0]} (exit {p.returncode})")
        time.sleep(0.005)
    ms = (time.perf_counter() - t0) * 1000
    p.terminate(); p.wait()
    return ms

expr = f"shiny::runApp(appDir = '{app}/app.R', port = {port}L, host = '127.0.0.1', launch.browser = FALSE)"
direct = ["R", "--no-echo", "--no-restore", "-e", expr]
launch = [bin, "launch", "--app-dir", app, "--scratch", scratch, "--entrypoint", "app.R",
          "--port", str(port), "--r-path", "R", "--copy", "1", "--app", "bench-app",
          "--home", f"{tmp}/home", "--sandbox", "{}"]
d, l = [], []
for _ in range(runs):
    d.append(start(direct)); l.append(start(launch))
print(f"copy start until its port answers, median of {runs}: "
      f"R directly {statistics.median(d):.0f} ms, through the launcher {statistics.median(l):.0f} ms "
      f"({statistics.median(l) - statistics.median(d):+.0f} ms)")
print("R directly:     ", " ".join(f"{x:.0f}" for x in d))
print("through launcher:", " ".join(f"{x:.0f}" for x in l))
PY
