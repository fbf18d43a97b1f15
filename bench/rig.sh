# Sourced by every bench: what they share.
#
#   BENCH_SHORT=1 bench/X.sh   one short round (a debug build, a few
#                              samples): that the bench still runs, not its
#                              figures. ./test.sh runs every bench so
#                              (bench/short.sh).
#   BIN=path/to/shinyctl       another build of shinyctl (no cargo build of it)
#   EXAMPLES=folder            the examples already built there (no cargo
#                              build of them either: comparing two builds of
#                              shinyctl while the source changes)
#
# After `source bench/rig.sh` (from the repository's root):
#   short        1 in short mode, else 0
#   tmp          a folder of the run's own, removed on exit
#   pids         the bench's own children: stopped by PID on exit
#   homes        SHINYCTL_HOMEs whose daemon, load balancer and copies are
#                stopped by PID on exit (SHINYCTL_HOME is $tmp/home, listed)
#   bench_build EXAMPLE...   builds shinyctl (unless BIN is set) and the
#                examples; sets bin and examples (their folder)
#   fast_app NAME PORT COPIES YAML   the fast backend as an app (below)
#   wait_copies NAME N          until the app has N ready, current copies
#   bench_apply MANIFEST        shinyctl apply, quiet unless it fails
#   status_py EXPR              prints EXPR over `status --json` (as j)
#   free_port, wait_port PORT, median, pick N_SHORT N_FULL
#
# The fast backend (examples/bench_backend.rs) runs as any app does: the
# daemon starts it through the launcher, fence and all, and the load
# balancer it started sends visitors to it. The manifest's r-path is a
# stand-in for R (bench/stand-in-R): the launcher runs
#   R --no-echo --no-restore --no-save
# with "shiny::runApp(appDir = ..., port = NNNNL, ...)" on R's standard
# input, and the stand-in takes the
# port out of the expression and execs the
# backend, which the working-dir holds (so the release holds it, and the
# fenced copy sees it in its own app folder).

short=0
case "${BENCH_SHORT:-}" in "" | 0) ;; *) short=1 ;; esac
tmp=$(mktemp -d)
pids=()
export SHINYCTL_HOME=$tmp/home
homes=("$SHINYCTL_HOME")

# pick SHORT FULL: the value for this mode.
pick() { if [ "$short" = 1 ]; then echo "$1"; else echo "$2"; fi; }

# Ends one process by PID: SIGTERM (to its group when it leads one), up to
# 10 s, then SIGKILL.
stop_pid() {
    local pid=$1
    [ -n "$pid" ] && [ "$pid" != 0 ] || return 0
    kill -- "-$pid" 2>/dev/null || kill "$pid" 2>/dev/null || return 0
    for _ in $(seq 1 100); do
        kill -0 "$pid" 2>/dev/null || return 0
        # Ended, but our own child not yet reaped (kill -0 still finds it).
        if [ "$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1)" = Z ]; then
            wait "$pid" 2>/dev/null || true
            return 0
        fi
        sleep 0.1
    done
    kill -9 -- "-$pid" 2>/dev/null || kill -9 "$pid" 2>/dev/null || true
}

# Stops what a SHINYCTL_HOME runs: the daemon first, waited for, so it
# starts nothing new when it sees the rest end; then the load balancer and
# every copy's launcher (each leads its process group, R in it).
stop_home() {
    local home=$1 daemon others
    [ -S "$home/api.sock" ] && [ -n "${bin:-}" ] || return 0
    read -r daemon others < <(SHINYCTL_HOME=$home "$bin" status --json 2>/dev/null | python3 -c 'import json,sys
j = json.load(sys.stdin)
p = [j["daemon_pid"] or 0, j["proxy_pid"]] + [x for a in j["apps"] for c in a["copies"] for x in (c.get("launcher_pid"), c["pid"])]
print(" ".join(str(x) for x in p if x is not None))' || true)
    stop_pid "$daemon"
    for pid in $others; do stop_pid "$pid"; done
    # A copy's launcher the daemon started between the status above and its
    # stop (a copy coming back after a kill) is in no list: found by the
    # `--home HOME` in its command line, as the tests' pids_with_home does.
    local pid
    for pid in $(python3 - "$home" <<'PY'
import os, sys
mark = b"\0--home\0" + os.fsencode(sys.argv[1]) + b"\0"
for p in filter(str.isdigit, os.listdir("/proc")):
    try:
        if mark in open(f"/proc/{p}/cmdline", "rb").read():
            print(p)
    except OSError:
        pass
PY
    ); do stop_pid "$pid"; done
    # The copies' cgroups (`shinyctl-<home tag>` in each hierarchy, as
    # src/sys/cgroup/mod.rs names them), empty now: removed, children
    # first, as the tests' remove_cgroups does. A daemon keeps them while
    # its copies may outlive it; a bench's home goes for good.
    python3 - "$home" <<'PY'
import hashlib, os, sys, time
# By the home as given and where it leads: the daemon names them by the
# home as it sees it.
tags = {hashlib.sha256(os.fsencode(h)).digest()[:4].hex() for h in (sys.argv[1], os.path.realpath(sys.argv[1]))}
names = {"shinyctl-" + t for t in tags}
found, level = [], ["/sys/fs/cgroup"]
for _ in range(5):
    deeper = []
    for d in level:
        try:
            subs = [e.path for e in os.scandir(d) if e.is_dir(follow_symlinks=False)]
        except OSError:
            continue
        for sub in subs:
            (found if os.path.basename(sub) in names else deeper).append(sub)
    level = deeper
end = time.time() + 5
while found and time.time() < end:
    for d in list(found):
        try:
            for e in os.scandir(d):
                if e.is_dir(follow_symlinks=False):
                    try:
                        os.rmdir(e.path)
                    except OSError:
                        pass
            os.rmdir(d)
            found.remove(d)
        except OSError:
            pass
    if found:
        time.sleep(0.1)
# The pool's zygote's temporary folder (`shinyctl-pool-<tag>-…`, see
# src/serve/copies/zygote_pool.rs), which a daemon killed leaves.
import shutil, tempfile
for e in os.scandir(tempfile.gettempdir()):
    if any(e.name.startswith(f"shinyctl-pool-{t}-") for t in tags):
        shutil.rmtree(e.path, ignore_errors=True)
PY
}

bench_cleanup() {
    local pid home
    for home in "${homes[@]}"; do stop_home "$home"; done
    for pid in "${pids[@]+"${pids[@]}"}"; do stop_pid "$pid"; done
    [ -z "${bench_unmount:-}" ] || umount "$bench_unmount" 2>/dev/null || true
    # A root run's copies' disks of their own outlive their copies: unmounted
    # here (deepest first), which frees their loop devices.
    awk -v t="$tmp/" 'index($5, t) == 1 {print $5}' /proc/self/mountinfo 2>/dev/null | sort -r | while read -r m; do
        umount -l "$m" 2>/dev/null || true
    done
    rm -rf "$tmp"
}
trap bench_cleanup EXIT

# bench_build EXAMPLE...: shinyctl and the examples named, release (debug
# in short mode). BIN, when set, is the shinyctl to measure.
bench_build() {
    local profile=(--release) dir=target/release args=() e
    if [ "$short" = 1 ]; then profile=() dir=target/debug; fi
    [ -n "${BIN:-}" ] || args+=(--bin shinyctl)
    if [ -z "${EXAMPLES:-}" ]; then
        for e in "$@"; do args+=(--example "$e"); done
    fi
    if [ "${#args[@]}" -gt 0 ] && ! cargo build "${profile[@]+"${profile[@]}"}" "${args[@]}" 2>"$tmp/build.log"; then
        cat "$tmp/build.log" >&2
        exit 1
    fi
    bin=$(realpath "${BIN:-$dir/shinyctl}")
    examples=$(realpath "${EXAMPLES:-$dir/examples}")
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

wait_port() {
    for _ in $(seq 1 200); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
        sleep 0.05
    done
    echo "$0: nothing listens on port $1" >&2
    exit 1
}

# The median of the numbers on standard input, one a line or a word.
median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

# status_py EXPR: EXPR evaluated over `shinyctl status --json` (j), printed.
status_py() {
    "$bin" status --json | python3 -c "import json,sys
j = json.load(sys.stdin)
print($1)"
}

# wait_copies NAME N: until app NAME has N ready copies, none outdated
# (60 s, 120 s in short mode, where the build is a debug one); fails at
# once when its copies have crashed three times.
wait_copies() {
    local name=$1 n=$2 got end=$((SECONDS + $(pick 120 60)))
    while [ "$SECONDS" -lt "$end" ]; do
        got=0
        "$bin" status --json 2>/dev/null | python3 -c 'import json,sys
j = json.load(sys.stdin); a = [a for a in j["apps"] if a["name"] == sys.argv[1]]
c = a[0]["copies"] if a else []
if sum(x["crashes"] for x in c) >= 3: sys.exit(2)
sys.exit(0 if sum(1 for x in c if x["ready"] and not x["outdated"]) >= int(sys.argv[2]) else 1)' "$name" "$n" || got=$?
        [ "$got" = 0 ] && return 0
        [ "$got" = 2 ] && break
        sleep 0.1
    done
    echo "$0: app $name never had $n ready copies" >&2
    "$bin" status >&2 || true
    tail -n 20 "$SHINYCTL_HOME/logs/default-$name.log" >&2 2>/dev/null || true
    exit 1
}

# bench_apply MANIFEST: shinyctl apply; its output shown only on failure.
bench_apply() {
    "$bin" apply -f "$1" >"$tmp/apply.log" 2>&1 || { cat "$tmp/apply.log" >&2; exit 1; }
}

# fast_app NAME PORT COPIES YAML: the fast backend as app NAME on PORT,
# never asleep, YAML added to its manifest (replicas, warm-replicas: it
# makes COPIES copies); waits until they are ready and sets copy_port and
# copy_pid (one of them).
fast_app() {
    local name=$1 port=$2 copies=$3 extra=$4 dir=$tmp/$1
    mkdir -p "$dir/app"
    cp "$examples/bench_backend" "$dir/app/"
    : >"$dir/app/app.R"
    printf 'app-name: %s\nport: %s\nworking-dir: app\nr-path: %s\nidle-timeout: 0\n%s' \
        "$name" "$port" "$PWD/bench/stand-in-R" "$extra" >"$dir/app.yaml"
    bench_apply "$dir/app.yaml"
    wait_copies "$name" "$copies"
    read -r copy_port copy_pid < <(status_py "' '.join(str(c[k]) for a in j['apps'] if a['name'] == '$name' for c in a['copies'][:1] for k in ('copy_port', 'pid'))")
}
