#!/usr/bin/env bash
# How long taking a release takes, and how much disk it uses, for working-dirs
# of 1 MB, 100 MB and 1 GB (app.R and one file of random bytes), with a plain
# `cp -r` of the same folder beside it, in one run. A release is taken by
# `shinyctl restart APP` (the app applied once before); both commands are
# timed the same way, by the shell's own clock ($EPOCHREALTIME, no process
# started to read it) around the command, so each time holds one process
# start. The daemon's own figure (apply's and restart's "taken in" line) is
# printed beside. SAMPLES samples of each, the two in turn and a different
# one first in each sample; the medians are printed, and every sample. Everything is read
# from the page cache (it was just written), and each sample starts after a
# `sync`; no time includes writing the copy back to disk.
#
#   bench/release.sh                # SAMPLES=3
#   BENCH_SHORT=1 bench/release.sh  # 1 MB only, 2 samples, a debug build
#
# First on the filesystem of $TMPDIR (this machine's disk); then, as root with
# mkfs.xfs installed, on a loop-mounted XFS (reflink on), where a release
# shares its extents with working-dir. "du" counts a file's blocks even when
# they are shared; "df" is the change in the filesystem's used space, the
# real cost (on the machine's own disk other programs write too, so it is
# approximate there); both are of the last sample.
#
# The app's copy is the fast backend (bench/rig.sh), not R, so no R start
# runs beside the timings; its manifest has `sandbox: mode: off`, so the
# copy can run the backend from the build folder (a fenced copy sees only
# its release, and the backend in the working-dir would add 1 MB to each).
# Uses its own temporary SHINYCTL_HOMEs and free ports; everything it starts
# is stopped by PID on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/rig.sh

SAMPLES=${SAMPLES:-$(pick 2 3)}
SIZES=${SIZES:-$(pick 1 "1 100 1024")}
bench_build bench_backend

df_used() { df -B1 --output=used "$1" | tail -1 | tr -d ' '; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
now_us() { echo "${EPOCHREALTIME/./}"; }
ms() { awk -v us="$1" 'BEGIN { printf "%.0f ms", us / 1000 }'; }
# The samples of a file of µs, in the order taken: "12, 9, 11 ms".
samples() { awk '{ printf "%s%.0f", (NR > 1 ? ", " : ""), $1 / 1000 } END { print " ms" }' "$1"; }

# release_once HOME NAME MANIFEST: a release by restart; appends the wall
# time (µs) and the daemon's figure to $tmp/rel.us and $tmp/rel.took.
release_once() {
    local home=$1 name=$2 out t0 t1
    t0=$(now_us)
    out=$(SHINYCTL_HOME=$home "$bin" restart "$name" 2>&1) || { echo "$out" >&2; exit 1; }
    t1=$(now_us)
    grep -q '^Release ' <<<"$out" || { echo "bench/release.sh: restart took no release: $out" >&2; exit 1; }
    echo $((t1 - t0)) >>"$tmp/rel.us"
    sed -n 's/.* taken in \(.*\)\.$/\1/p' <<<"$out" >>"$tmp/rel.took"
}

# cp_once APP DEST: a cp -r; appends its wall time (µs) to $tmp/cp.us.
cp_once() {
    local t0 t1
    t0=$(now_us)
    cp -r "$1" "$2"
    t1=$(now_us)
    echo $((t1 - t0)) >>"$tmp/cp.us"
}

# bench_on LABEL DIR: the sizes with working-dirs and SHINYCTL_HOME in DIR.
bench_on() {
    local label=$1 dir=$2
    local home=$dir/home
    homes+=("$home")
    echo
    echo "== $label ($(df --output=fstype "$dir" | tail -1 | tr -d ' '), $dir), median of $SAMPLES"
    printf '%-7s %-22s %10s %12s %12s\n' "size" "what" "time" "du" "df"
    for size in $SIZES; do
        local app=$dir/app-$size name=rel$size port
        port=$(free_port)
        mkdir -p "$app"
        cp examples/hello/app.R "$app/"
        head -c $((size << 20)) /dev/urandom >"$app/data.bin"
        printf 'app-name: %s\nport: %s\nworking-dir: app-%s\nhost: 127.0.0.1\nwarm-replicas: 0\nidle-timeout: 0\nr-path: %s\nenv:\n  BENCH_BACKEND: %s\nsandbox:\n  mode: "off"\n' \
            "$name" "$port" "$size" "$PWD/bench/stand-in-R" "$examples/bench_backend" >"$dir/$name.yaml"
        # The first release (not counted) also reads the folder into the cache.
        SHINYCTL_HOME=$home bench_apply "$dir/$name.yaml"
        : >"$tmp/rel.us"
        : >"$tmp/rel.took"
        : >"$tmp/cp.us"
        local s rel_df cp_df before
        for s in $(seq 1 "$SAMPLES"); do
            rm -rf "$dir/cp-$size"
            for what in $([ $((s % 2)) = 1 ] && echo "release cp" || echo "cp release"); do
                sync
                before=$(df_used "$dir")
                if [ "$what" = release ]; then
                    release_once "$home" "$name"
                    rel_df=$(($(df_used "$dir") - before))
                else
                    cp_once "$app" "$dir/cp-$size"
                    cp_df=$(($(df_used "$dir") - before))
                fi
            done
        done
        local rel cp_dir=$dir/cp-$size
        rel=$(SHINYCTL_HOME=$home "$bin" status --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["apps"][0]["release"])')
        printf '%-7s %-22s %10s %12s %12s\n' "${size}M" "release (restart)" "$(ms "$(median <"$tmp/rel.us")")" \
            "$(mib "$(du -sB1 "$home/releases/default/$name/$rel" | cut -f1)")" "$(mib "$rel_df")"
        printf '%-7s %-22s %s\n' "" "  each:" "$(samples "$tmp/rel.us")"
        printf '%-7s %-22s %s\n' "" "  the daemon's own:" "$(paste -sd, "$tmp/rel.took" | sed 's/,/, /g')"
        printf '%-7s %-22s %10s %12s %12s\n' "" "cp -r" "$(ms "$(median <"$tmp/cp.us")")" "$(mib "$(du -sB1 "$cp_dir" | cut -f1)")" "$(mib "$cp_df")"
        printf '%-7s %-22s %s\n' "" "  each:" "$(samples "$tmp/cp.us")"
        SHINYCTL_HOME=$home "$bin" delete "$name" --now >/dev/null
        rm -rf "$cp_dir"
    done
}

echo "shinyctl release bench, $(nproc) cores, $(uname -r), $(basename "$(dirname "$bin")") build"
mkdir -p "$tmp/disk"
bench_on "this machine's disk" "$tmp/disk"

if [ "$(id -u)" -eq 0 ] && command -v mkfs.xfs >/dev/null; then
    truncate -s "$(pick 512M 4G)" "$tmp/xfs.img"
    mkfs.xfs -q -m reflink=1 "$tmp/xfs.img"
    mkdir -p "$tmp/xfs"
    mount -o loop "$tmp/xfs.img" "$tmp/xfs"
    bench_unmount=$tmp/xfs
    bench_on "a loop-mounted XFS" "$tmp/xfs"
else
    echo
    echo "(XFS skipped: needs root and mkfs.xfs)"
fi
