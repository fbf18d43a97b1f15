#!/usr/bin/env bash
# Installs (or upgrades) shinyctl.
#
#   ./install.sh                build if needed, then install shinyctl, its man page, shell
#                               completions and the systemd service file (where systemd runs)
#   ./install.sh --service      the same, then enable and start the service. As root it is a
#                               system service, /etc/systemd/system/shinyctl.service, that runs
#                               shinyctl serve as root (so run-as works) from boot on. Otherwise
#                               it is your user service, ~/.config/systemd/user/shinyctl.service,
#                               with lingering enabled, so it runs from boot on and while you are
#                               logged out.
#   ./install.sh --prefix DIR   install under DIR (DIR/bin/shinyctl, DIR/share/...)
#   ./install.sh --help         print this help
#
# Where: as root /usr/local (on every login shell's PATH), otherwise ~/.local.
# ~/.local/bin/shinyctl always works (as root it links to /usr/local/bin/shinyctl),
# which is why the README's quick start calls it by that path.
# Running it again is the upgrade path: it rebuilds, replaces the binary and
# tells you how to restart shinyctl serve (your apps keep running).
set -euo pipefail

usage() { # the comment block at the top of this file, whole
    awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"
}

enable_service=0
prefix=""
while [ "$#" -gt 0 ]; do
    case "$1" in
        --service) enable_service=1 ;;
        --prefix) [ "$#" -ge 2 ] || { echo "install.sh: --prefix needs a folder" >&2; exit 2; }; prefix="$2"; shift ;;
        --prefix=*) prefix="${1#--prefix=}" ;;
        -h|--help) usage; exit 0 ;;
        *) echo "install.sh: unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
    shift
done

cd "$(dirname "${BASH_SOURCE[0]}")"

# Root gets the system service, everyone else a user service: which unit
# file, where it goes, and the systemctl that manages it.
if [ "$(id -u)" -eq 0 ]; then
    unit_src=shinyctl-system.service
    unit_dir=/etc/systemd/system
    systemctl_=(systemctl)
    manager="no systemd system manager (is systemd PID 1 here?)"
else
    unit_src=shinyctl.service
    unit_dir="${XDG_CONFIG_HOME:-$HOME/.config}/systemd/user"
    systemctl_=(systemctl --user)
    manager="no systemd user manager for ${USER:-$(id -un 2>/dev/null || id -u)}"
fi

# --service needs systemd: say so before anything is built or installed.
if [ "$enable_service" -eq 1 ]; then
    if ! command -v systemctl >/dev/null 2>&1; then
        echo "install.sh --service: systemctl is not on PATH, so there is no systemd to run the service." >&2
        echo "Nothing was installed. Run ./install.sh without --service, then start shinyctl with:  shinyctl serve -d" >&2
        exit 1
    fi
    if ! "${systemctl_[@]}" show-environment >/dev/null 2>&1; then
        echo "install.sh --service: ${systemctl_[*]} does not answer: $manager." >&2
        if [ "$(id -u)" -ne 0 ]; then
            echo "Log in again (a login session starts it), or run ./install.sh without --service" >&2
        else
            echo "Run ./install.sh without --service" >&2
        fi
        echo "and start shinyctl with:  shinyctl serve -d   (nothing was installed)" >&2
        exit 1
    fi
fi

user_bin="$HOME/.local/bin"
if [ -z "$prefix" ]; then
    if [ "$(id -u)" -eq 0 ]; then prefix=/usr/local; else prefix="$HOME/.local"; fi
    link_user_bin=1
else
    link_user_bin=0
fi
bin_dir="$prefix/bin"
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

# 2. Build, unless the release binary is newer than every source.
built="${CARGO_TARGET_DIR:-target}/release/shinyctl"
if [ -x "$built" ] && [ -f "$(dirname "$built")/libshinyctl.so" ] &&
   [ -z "$(find src Cargo.toml Cargo.lock build.rs -newer "$built" -print -quit 2>/dev/null)" ]; then
    echo "==> $built is newer than every source file: not building again"
else
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
fi

# 3. Install the binary: copy to a temporary name in the same folder, then
# rename over the old one, so a running shinyctl is never overwritten in place.
echo "==> installing $bin_dir/shinyctl"
mkdir -p "$bin_dir"
tmp="$bin_dir/.shinyctl.new.$$"
trap 'rm -f "$tmp"' EXIT
cp "$built" "$tmp"
chmod 0755 "$tmp"
mv -f "$tmp" "$bin_dir/shinyctl"
# The pool's library beside it (README, "Sleep and wake": the pool's
# zygote, an R process, loads it to wait for claims), renamed over the old
# one the same way: a zygote that has the old one loaded keeps it.
lib_tmp="$bin_dir/.libshinyctl.so.new.$$"
trap 'rm -f "$tmp" "$lib_tmp"' EXIT
cp "$(dirname "$built")/libshinyctl.so" "$lib_tmp"
chmod 0644 "$lib_tmp"
mv -f "$lib_tmp" "$bin_dir/libshinyctl.so"
trap - EXIT
"$bin_dir/shinyctl" version 2>/dev/null || true
if [ "$link_user_bin" -eq 1 ] && [ "$bin_dir" != "$user_bin" ]; then
    # One path that works for root and for everyone else: ~/.local/bin/shinyctl.
    # (It replaces a binary an older install.sh put there.)
    mkdir -p "$user_bin"
    ln -sfn "$bin_dir/shinyctl" "$user_bin/shinyctl"
fi

# 3b. The man page and shell completions, where man and the shells look.
share="$prefix/share"
echo "==> installing the man page and completions under $share"
install_generated() { # FILE ARGS...: write `shinyctl ARGS` to FILE
    local file="$1"; shift
    mkdir -p "$(dirname "$file")"
    "$bin_dir/shinyctl" "$@" >"$file.new" && mv -f "$file.new" "$file"
}
install_generated "$share/man/man1/shinyctl.1" man
install_generated "$share/bash-completion/completions/shinyctl" completions bash
install_generated "$share/zsh/site-functions/_shinyctl" completions zsh
install_generated "$share/fish/vendor_completions.d/shinyctl.fish" completions fish

# 4. The systemd service file, where systemd (system or user) answers.
have_systemd=0
if command -v systemctl >/dev/null 2>&1 && "${systemctl_[@]}" show-environment >/dev/null 2>&1; then
    have_systemd=1
fi
service_active=0
if [ "$have_systemd" -eq 1 ]; then
    echo "==> installing $unit_dir/shinyctl.service"
    mkdir -p "$unit_dir"
    sed -e "s|^ExecStart=.*|ExecStart=$bin_dir/shinyctl serve|" -e "s|^ExecReload=.*|ExecReload=$bin_dir/shinyctl reload|" \
        "$unit_src" >"$unit_dir/shinyctl.service.new"
    chmod 0644 "$unit_dir/shinyctl.service.new"
    mv -f "$unit_dir/shinyctl.service.new" "$unit_dir/shinyctl.service"
    "${systemctl_[@]}" daemon-reload
    echo "    ran: ${systemctl_[*]} daemon-reload"
    if "${systemctl_[@]}" is-active --quiet shinyctl; then
        service_active=1
    fi
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
if [ "$have_systemd" -eq 1 ] && [ "$enable_service" -eq 1 ]; then
    echo "==> enabling the shinyctl service (${systemctl_[*]})"
    if [ "$service_active" -eq 1 ]; then
        "${systemctl_[@]}" enable shinyctl
        echo "    ran: ${systemctl_[*]} enable shinyctl"
        echo "The service was already running the old binary. To run the new one:"
        echo "  ${systemctl_[*]} restart shinyctl"
    elif [ "$daemon_running" -eq 1 ]; then
        # A second shinyctl serve for the same home would refuse to start.
        "${systemctl_[@]}" enable shinyctl
        echo "    ran: ${systemctl_[*]} enable shinyctl (not started: a shinyctl serve you started by hand runs)"
        echo "To hand it over to the service (your apps keep running and are adopted):"
        echo "  pkill -u \"\$USER\" -f '(^|/)shinyctl serve\$' && ${systemctl_[*]} start shinyctl"
    else
        "${systemctl_[@]}" enable --now shinyctl
        echo "    ran: ${systemctl_[*]} enable --now shinyctl (enabled and started)"
    fi
    if [ "$(id -u)" -ne 0 ]; then
        linger_user="${USER:-$(id -un)}"
        if ! command -v loginctl >/dev/null 2>&1; then
            echo "warning: loginctl is not on PATH, so lingering was not enabled: the service stops when you log out." >&2
        elif loginctl enable-linger "$linger_user"; then
            echo "    ran: loginctl enable-linger $linger_user (the service keeps running while you are logged out)"
        else
            echo "warning: loginctl enable-linger $linger_user failed: the service stops when you log out." >&2
        fi
    fi
else
    if [ "$daemon_running" -eq 1 ] || [ "$service_active" -eq 1 ]; then
        echo "shinyctl serve is running the old binary. To upgrade it (your apps keep running):"
        if [ "$service_active" -eq 1 ]; then
            echo "  ${systemctl_[*]} restart shinyctl"
        else
            echo "  $restart_by_hand"
        fi
    fi
    if [ "$have_systemd" -eq 1 ] && [ "$service_active" -eq 0 ]; then
        echo "To run shinyctl serve as a systemd service (./install.sh --service does it):"
        echo "  ${systemctl_[*]} enable --now shinyctl"
        if [ "$(id -u)" -ne 0 ]; then
            echo "  loginctl enable-linger \"\$USER\"    # keep it running while you are logged out"
        fi
    elif [ "$have_systemd" -eq 0 ]; then
        echo "systemd services are not available here: the first shinyctl apply starts"
        echo "shinyctl serve, or start it yourself with:  shinyctl serve -d"
    fi
fi

run_as="shinyctl"
case ":$PATH:" in
    *":$bin_dir:"*) ;;
    *)
        run_as="$bin_dir/shinyctl"
        echo
        echo "note: $bin_dir is not on this shell's PATH, so call shinyctl as $bin_dir/shinyctl,"
        echo "      or add the folder to PATH (Debian's ~/.profile adds ~/.local/bin at login once it exists):"
        echo "  export PATH=\"$bin_dir:\$PATH\""
        ;;
esac

echo
echo "Installed $bin_dir/shinyctl. Try:  $run_as apply -f examples/hello/app.yaml   then open http://localhost:8765"
