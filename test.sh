#!/usr/bin/env bash
# The project's one test command:  ./test.sh [CARGO TEST ARGS] [-- TEST BINARY ARGS]
#
#   ./test.sh                      # everything
#   ./test.sh proxy                # only tests whose name contains "proxy"
#   ./test.sh --test it -- --nocapture   # only the integration tests (tests/it)
#
# Installs what the tests need when it is missing (Debian/Ubuntu), builds, and
# runs `cargo test -- --test-threads=3`. Without cargo arguments (the whole
# suite), it then runs every bench once in its short mode (bench/short.sh,
# under a minute), so a bench that no longer runs fails too.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")"

# cargo from rustup is often not on PATH in a fresh root shell.
if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi

echo "==> checking test dependencies"
# xfsprogs: the release test on a loop-mounted XFS (shared extents).
bash scripts/deps.sh r-base-core r-cran-shiny xfsprogs e2fsprogs
# R Markdown documents with runtime: shiny (pandoc comes with it).
bash scripts/deps.sh r-cran-rmarkdown
# The fence's filter tests: an app runs strace -p and a Python probe.
bash scripts/deps.sh strace python3
# A daemon that is not root gives each app one of its user's subordinate
# ids with newuidmap/newgidmap (and useradd gives test users such ids).
bash scripts/deps.sh uidmap
# The systemd units are checked with systemd-analyze verify (and the man
# page their Documentation= names, with man).
bash scripts/deps.sh systemd man-db
# Several hosts behind a real HAProxy (Debian's).
bash scripts/deps.sh haproxy
# The browser test: Chromium with what Debian recommends beside it (fonts).
bash scripts/deps.sh --recommends chromium chromium-driver
# The benches' short runs: wrk (bench/proxy.sh), curl.
bash scripts/deps.sh wrk curl

# Arguments before a "--" go to cargo test, those after it to the test binaries.
cargo_args=()
bin_args=()
seen_sep=0
for arg in "$@"; do
    if [ "$seen_sep" -eq 0 ] && [ "$arg" = "--" ]; then
        seen_sep=1
    elif [ "$seen_sep" -eq 0 ]; then
        cargo_args+=("$arg")
    else
        bin_args+=("$arg")
    fi
done
# Three at a time on two cores: most of an integration test is waiting (on
# R's start, on the documented timers of 10 s to a minute), and the CPU was
# busy 65% of the time with three (the integration tests 507 s against 674
# with two, 3 December 2026).
threads=(--test-threads=3)
for arg in "${bin_args[@]+"${bin_args[@]}"}"; do
    case "$arg" in --test-threads|--test-threads=*) threads=() ;; esac
done

# The tree as rustfmt.toml formats it, and no lint clippy finds: a
# formatting slip or a new warning fails the run, as a test would.
echo "==> cargo fmt --check; cargo clippy --all-targets -- -D warnings"
cargo fmt --check
cargo clippy --all-targets -- -D warnings

echo "==> cargo build"
cargo build

# The upgrade test starts from a build that really differs: the last
# release before the current work (its source from git, built once into
# target/previous), not this build with its id rewritten.
previous=5bbc6ab06f0698681d456e9c99ca46293ebdd83d
echo "==> the previous build ($previous) for the upgrade test"
if [ ! -x target/previous/debug/shinyctl ] || [ "$(cat target/previous/commit 2>/dev/null)" != "$previous" ]; then
    rm -rf target/previous-src
    mkdir -p target/previous-src
    git archive "$previous" | tar -x -C target/previous-src
    cargo build --quiet --manifest-path target/previous-src/Cargo.toml --target-dir target/previous
    echo "$previous" > target/previous/commit
fi
export SHINYCTL_PREVIOUS_BUILD="$PWD/target/previous/debug/shinyctl"

test_cmd=(cargo test "${cargo_args[@]+"${cargo_args[@]}"}" -- "${threads[@]+"${threads[@]}"}" "${bin_args[@]+"${bin_args[@]}"}")
echo "==> ${test_cmd[*]}"
"${test_cmd[@]}"

if [ "${#cargo_args[@]}" -eq 0 ]; then
    echo "==> bench/short.sh (every bench once, short)"
    bash bench/short.sh
fi
