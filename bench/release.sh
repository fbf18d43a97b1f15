#!/usr/bin/env bash
# How long taking a release takes, and how much disk it uses, for working-dirs
# of 1 MB, 100 MB and 1 GB (app.R and one file of random bytes), with a plain
# `cp -r` of the same folder beside it, in one run. The release is taken by
# the daemon through `shinyctl apply` (its own timing, printed in apply's
# "Release …" line); `cp -r` is timed here. Both read the folder from the
# page cache (it was just written), and each starts after a `sync`; neither
# time includes writing the copy back to disk.
#
#   bench/release.sh
#
# First on the filesystem of $TMPDIR (this machine's disk); then, as root with
# mkfs.xfs installed, on a loop-mounted XFS (reflink on), where a release
# shares its extents with working-dir. "du" counts a file's blocks even when
# they are shared; "df" is the change in the filesystem's used space, the
# real cost (on the machine's own disk other programs write too, so it is
# approximate there).
#
# Uses its own temporary SHINYCTL_HOME and free ports; everything it starts
# is stopped by PID on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release --bin shinyctl 2>/dev/null
bin=$PWD/target/release/shinyctl
tmp=$(mktemp -d)
homes=()
mnt=""

cleanup() {
    for home in "${homes[@]+"${homes[@]}"}"; do
        local pids
        pids=$(SHINYCTL_HOME=$home "$bin" status --json 2>/dev/null | python3 -c 'import json,sys
j=json.load(sys.stdin); print(" ".join(str(p) for p in [j["daemon_pid"], j["proxy_pid"]] + [c["pid"] for a in j["apps"] for c in a["copies"]] if p))' || true)
        for pid in $pids; do kill "$pid" 2>/dev/null || true; done
    done
    sleep 1
    if [ -n "$mnt" ]; then umount "$mnt" 2>/dev/null || true; fi
    rm -rf "$tmp"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
df_used() { df -B1 --output=used "$1" | tail -1 | tr -d ' '; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }

# bench_on LABEL DIR: the three sizes with working-dirs and SHINYCTL_HOME in DIR.
bench_on() {
    local label=$1 dir=$2
    local home=$dir/home
    homes+=("$home")
    echo
    echo "== $label ($(df --output=fstype "$dir" | tail -1 | tr -d ' '), $dir)"
    printf '%-7s %-9s %10s %12s %12s\n' "size" "what" "time" "du" "df"
    for size in 1 100 1024; do
        local app=$dir/app-$size name=rel$size port
        port=$(free_port)
        mkdir -p "$app"
        cp examples/hello/app.R "$app/"
        head -c $((size << 20)) /dev/urandom > "$app/data.bin"
        printf 'app-name: %s\nport: %s\nwarm-replicas: 0\n' "$name" "$port" > "$app/app.yaml"
        sync
        local before after out id took
        before=$(df_used "$dir")
        out=$(SHINYCTL_HOME=$home "$bin" apply -f "$app/app.yaml" 2>/dev/null)
        after=$(df_used "$dir")
        id=$(sed -n 's/^Release \([^:]*\):.*/\1/p' <<<"$out")
        took=$(sed -n 's/.* taken in \(.*\)\.$/\1/p' <<<"$out")
        local rel=$home/releases/default/$name/$id
        printf '%-7s %-9s %10s %12s %12s\n' "${size}M" "release" "$took" "$(mib "$(du -sB1 "$rel" | cut -f1)")" "$(mib $((after - before)))"

        # Each starts with nothing left to write back from the one before.
        sync
        local t0 t1
        before=$(df_used "$dir")
        t0=$(date +%s%N)
        cp -r "$app" "$dir/cp-$size"
        t1=$(date +%s%N)
        after=$(df_used "$dir")
        printf '%-7s %-9s %10s %12s %12s\n' "${size}M" "cp -r" "$(((t1 - t0) / 1000000)) ms" "$(mib "$(du -sB1 "$dir/cp-$size" | cut -f1)")" "$(mib $((after - before)))"
        SHINYCTL_HOME=$home "$bin" delete "$name" --now >/dev/null
        rm -rf "$dir/cp-$size"
    done
}

echo "shinyctl release bench, $(nproc) cores, $(uname -r)"
mkdir -p "$tmp/disk"
bench_on "this machine's disk" "$tmp/disk"

if [ "$(id -u)" -eq 0 ] && command -v mkfs.xfs >/dev/null; then
    truncate -s 4G "$tmp/xfs.img"
    mkfs.xfs -q -m reflink=1 "$tmp/xfs.img"
    mnt=$tmp/xfs
    mkdir -p "$mnt"
    mount -o loop "$tmp/xfs.img" "$mnt"
    bench_on "a loop-mounted XFS" "$mnt"
else
    echo
    echo "(XFS skipped: needs root and mkfs.xfs)"
fi
