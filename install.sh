#!/usr/bin/env bash
# Installs (or upgrades) shinyctl for the current user.
#
#   ./install.sh             build, install ~/.local/bin/shinyctl and the user service file
#   ./install.sh --service   the same, then enable and start the systemd user service
#
# Running it again is the upgrade path: it rebuilds, replaces the binary and
# tells you how to restart shinyctl serve (your apps keep running).
set -euo pipefail

usage() {
    sed -n '2,8s/^# \{0,1\}//p' "$0"
}

enable_service=0
for arg in "$@"; do
    case "$arg" in
        --service) enable_service=1 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "install.sh: unknown argument: $arg" >&2; usage >&2; exit 2 ;;
    esac
done

cd "$(dirname "${BASH_SOURCE[0]}")"

bin_dir="$HOME/.local/bin"
unit_dir="${XDG_CONFIG_HOME:-$HOME/.config}/systemd/user"
shinyctl_home="${SHINYCTL_HOME:-$HOME/.shinyctl}"
restart_by_hand="pkill -u \"\$USER\" -f '(^|/)shinyctl serve\$' && shinyctl serve -d"

if [ "$(id -u)" -eq 0 ] && [ -n "${SUDO_USER:-}" ]; then
    echo "note: running under sudo, so shinyctl is installed for root ($HOME)."
    echo "      Run ./install.sh as yourself to install it for your user; it uses sudo only for apt-get."
fi

# 1. R and shiny.
echo "==> checking R and shiny"
bash scripts/deps.sh r-base-core r-cran-shiny
if ! command -v R >/dev/null 2>&1; then
    echo "warning: R is not on PATH. Install R and the shiny package, or set r-path in your manifests." >&2
fi

# 2. Build.
if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi
need_rust="$(sed -n 's/^rust-version *= *"\(.*\)"/\1/p' Cargo.toml | head -n 1)"
if ! command -v cargo >/dev/null 2>&1; then
    echo "cargo not found. Install Rust ${need_rust:+$need_rust or newer }from your distribution" >&2
    echo "(e.g. apt-get install cargo, if its version is recent enough) or with rustup:" >&2
    echo "  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh" >&2
    echo "then run ./install.sh again." >&2
    exit 1
fi
have_rust="$(cargo --version | sed -n 's/^cargo \([0-9]*\.[0-9]*\).*/\1/p')"
if [ -n "$need_rust" ] && [ -n "$have_rust" ] &&
   [ "$(printf '%s\n%s\n' "$need_rust" "$have_rust" | sort -V | head -n 1)" != "$need_rust" ]; then
    echo "cargo $have_rust is too old: shinyctl needs Rust $need_rust or newer." >&2
    echo "Install a newer one with rustup (https://rustup.rs), then run ./install.sh again." >&2
    exit 1
fi

echo "==> cargo build --release"
cargo build --release
built="${CARGO_TARGET_DIR:-target}/release/shinyctl"

# 3. Install the binary: copy to a temporary name in the same folder, then
# rename over the old one, so a running shinyctl is never overwritten in place.
echo "==> installing $bin_dir/shinyctl"
mkdir -p "$bin_dir"
tmp="$bin_dir/.shinyctl.new.$$"
trap 'rm -f "$tmp"' EXIT
cp "$built" "$tmp"
chmod 0755 "$tmp"
mv -f "$tmp" "$bin_dir/shinyctl"
trap - EXIT
"$bin_dir/shinyctl" version 2>/dev/null || true

# 4. The systemd user service, when systemd --user is available.
have_user_systemd=0
if command -v systemctl >/dev/null 2>&1 && systemctl --user show-environment >/dev/null 2>&1; then
    have_user_systemd=1
fi
service_active=0
if [ "$have_user_systemd" -eq 1 ]; then
    echo "==> installing $unit_dir/shinyctl.service"
    mkdir -p "$unit_dir"
    cp shinyctl.service "$unit_dir/shinyctl.service.new"
    mv -f "$unit_dir/shinyctl.service.new" "$unit_dir/shinyctl.service"
    systemctl --user daemon-reload
    if systemctl --user is-active --quiet shinyctl; then
        service_active=1
    fi
elif [ "$enable_service" -eq 1 ]; then
    echo "warning: --service: systemd user services are not available here (systemctl --user does not answer)." >&2
fi

# 5. Is a shinyctl serve already running for this home?
daemon_running=0
sock="$shinyctl_home/api.sock"
if [ -S "$sock" ]; then
    if command -v curl >/dev/null 2>&1; then
        if curl -fsS --max-time 3 --unix-socket "$sock" http://shinyctl/v1/status >/dev/null 2>&1; then
            daemon_running=1
        fi
    else
        daemon_running=1 # cannot ask without curl; the socket is there
    fi
fi

echo
if [ "$have_user_systemd" -eq 1 ] && [ "$enable_service" -eq 1 ]; then
    systemctl --user enable shinyctl
    if [ "$service_active" -eq 1 ]; then
        echo "The service was already running the old binary. To run the new one:"
        echo "  systemctl --user restart shinyctl"
    elif [ "$daemon_running" -eq 1 ]; then
        echo "A shinyctl serve you started by hand is running. To hand it over to the service"
        echo "(your apps keep running and are adopted):"
        echo "  pkill -u \"\$USER\" -f '(^|/)shinyctl serve\$' && systemctl --user start shinyctl"
    else
        systemctl --user start shinyctl
        echo "Started the shinyctl user service."
    fi
    echo "To keep it running while you are logged out:  loginctl enable-linger \"\$USER\""
else
    if [ "$daemon_running" -eq 1 ] || [ "$service_active" -eq 1 ]; then
        echo "shinyctl serve is running the old binary. To upgrade it (your apps keep running):"
        if [ "$service_active" -eq 1 ]; then
            echo "  systemctl --user restart shinyctl"
        else
            echo "  $restart_by_hand"
        fi
    fi
    if [ "$have_user_systemd" -eq 1 ] && [ "$service_active" -eq 0 ]; then
        echo "To run shinyctl serve as a systemd user service (./install.sh --service does it):"
        echo "  systemctl --user enable --now shinyctl"
        echo "  loginctl enable-linger \"\$USER\"    # keep it running while you are logged out"
    elif [ "$have_user_systemd" -eq 0 ]; then
        echo "systemd user services are not available here: the first shinyctl apply starts"
        echo "shinyctl serve, or start it yourself with:  shinyctl serve -d"
    fi
fi

case ":$PATH:" in
    *":$bin_dir:"*) ;;
    *)
        echo
        echo "warning: $bin_dir is not on your PATH. Add it, for example:" >&2
        echo "  echo 'export PATH=\"\$HOME/.local/bin:\$PATH\"' >> ~/.profile && . ~/.profile" >&2
        ;;
esac

echo
echo "Installed $bin_dir/shinyctl. Try:  shinyctl apply -f examples/hello/app.yaml   then open http://localhost:8765"
