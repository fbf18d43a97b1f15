#!/usr/bin/env bash
# Installs Debian/Ubuntu packages that are missing.
#
#   scripts/deps.sh PACKAGE...              # run it
#   scripts/deps.sh --recommends PACKAGE... # with the packages' recommends
#   . scripts/deps.sh; deps_install PACKAGE...   # or source it and call the function
#
# Each package is checked with `dpkg -s` first; `apt-get update` runs only when
# something is missing. As root apt-get runs directly, otherwise through sudo.
# On a system without dpkg/apt-get it only says what to install by hand.

deps_installed() {
    dpkg -s "$1" 2>/dev/null | grep -q '^Status: install ok installed$'
}

deps_install() {
    local recommends=(--no-install-recommends)
    if [ "${1:-}" = "--recommends" ]; then
        recommends=()
        shift
    fi
    if [ "$#" -eq 0 ]; then
        return 0
    fi
    if ! command -v dpkg >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
        echo "deps: not a Debian/Ubuntu system (no dpkg/apt-get); make sure these are installed: $*" >&2
        return 0
    fi

    local missing=() pkg
    for pkg in "$@"; do
        deps_installed "$pkg" || missing+=("$pkg")
    done
    if [ "${#missing[@]}" -eq 0 ]; then
        echo "deps: already installed: $*"
        return 0
    fi

    local sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        if command -v sudo >/dev/null 2>&1; then
            sudo=(sudo)
        else
            echo "deps: missing ${missing[*]}, and not root and no sudo: install them as root with" >&2
            echo "  apt-get update && apt-get install -y --no-install-recommends ${missing[*]}" >&2
            return 1
        fi
    fi

    echo "deps: installing ${missing[*]}"
    "${sudo[@]+"${sudo[@]}"}" env DEBIAN_FRONTEND=noninteractive apt-get update
    "${sudo[@]+"${sudo[@]}"}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y "${recommends[@]+"${recommends[@]}"}" "${missing[@]}"
}

# Run directly (not sourced): install the packages named on the command line.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    set -euo pipefail
    deps_install "$@"
fi
