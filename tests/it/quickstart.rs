//! The README's quick start, run verbatim as a new user would: a fresh
//! login shell of root with a clean environment and a temporary HOME, in
//! network and mount namespaces of its own (so port 8765 is free and the
//! machine's /usr/local is not touched), with the build already done.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::helpers::*;

/// The first command of the README's "Quick start".
fn quick_start_line() -> String {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let section = &readme[readme.find("## Quick start").expect("README has a Quick start")..];
    let block = &section[section.find("```sh\n").expect("a sh block") + 6..];
    block.lines().next().unwrap().to_string()
}

/// Copies what a checkout holds for install.sh (sources, scripts, examples).
pub fn copy_checkout(to: &Path) {
    let from = Path::new(env!("CARGO_MANIFEST_DIR"));
    for entry in
        ["install.sh", "Cargo.toml", "Cargo.lock", "build.rs", "shinyctl.service", "shinyctl-system.service", "src", "scripts", "examples"]
    {
        let out = Command::new("cp").arg("-a").arg(from.join(entry)).arg(to).output().unwrap();
        assert!(out.status.success(), "cp {entry}: {}", String::from_utf8_lossy(&out.stderr));
    }
    // "The build already done": a binary newer than every source.
    let release = to.join("target/release");
    std::fs::create_dir_all(&release).unwrap();
    std::fs::copy(bin(), release.join("shinyctl")).unwrap();
    // And the pool's library built with it (`cargo test` leaves the newest
    // in deps/).
    let built = Path::new(bin()).with_file_name("libshinyctl.so");
    let in_deps = Path::new(bin()).with_file_name("deps").join("libshinyctl.so");
    let mtime = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let lib = if mtime(&in_deps) > mtime(&built) { in_deps } else { built };
    std::fs::copy(&lib, release.join("libshinyctl.so")).unwrap_or_else(|e| panic!("{}: {e}", lib.display()));
    let later = std::time::SystemTime::now() + Duration::from_secs(2);
    std::fs::File::options().write(true).open(release.join("shinyctl")).unwrap().set_modified(later).unwrap();
}

#[test]
fn the_readme_quick_start_works_verbatim_in_a_fresh_root_login_shell() {
    quick_start_as(None);
}

#[test]
fn the_readme_quick_start_works_verbatim_in_a_fresh_login_shell_of_a_normal_user() {
    quick_start_as(Some(4242));
}

/// Runs the README's first command in a fresh login shell, as root or as a
/// normal user (uid `user`, added to a private copy of /etc/passwd inside
/// the test's mount namespace, so the machine's user list is not touched).
fn quick_start_as(user: Option<u32>) {
    if !needs_root("its own network and mount namespaces") {
        return;
    }
    let line = quick_start_line();
    assert!(line.starts_with("./install.sh && "), "the quick start line: {line}");
    let env = Env::new(if user.is_some() { "quickstart-user" } else { "quickstart-root" });
    let checkout = env.dir.join("checkout");
    std::fs::create_dir_all(&checkout).unwrap();
    copy_checkout(&checkout);
    let user_home = env.dir.join("login-home");
    // A new account's home, as useradd -m makes it (Debian's ~/.profile puts
    // ~/.local/bin on PATH at login once it exists).
    let out = Command::new("cp").arg("-a").arg("/etc/skel").arg(&user_home).output().unwrap();
    assert!(out.status.success(), "cp /etc/skel: {}", String::from_utf8_lossy(&out.stderr));
    // The test's own handle on what the line starts: its home is ~/.shinyctl.
    std::fs::remove_dir_all(env.home()).unwrap();
    std::os::unix::fs::symlink(user_home.join(".shinyctl"), env.home()).unwrap();

    // Debian's /etc/profile sets PATH for root and for everyone else.
    let (become_user, add_user) = match user {
        None => (String::new(), String::new()),
        Some(uid) => {
            let passwd = env.dir.join("passwd");
            (
                format!("setpriv --reuid={uid} --regid={uid} --clear-groups "),
                format!(
                    "chown -R {uid}:{uid} '{home}' '{checkout}' && chmod 755 '{dir}'
                     cp /etc/passwd '{passwd}' && echo 'qs:x:{uid}:{uid}::{home}:/bin/bash' >>'{passwd}'
                     mount --bind '{passwd}' /etc/passwd
",
                    home = user_home.display(),
                    // A checkout of the user's own: the example's state.json
                    // is written beside its manifest.
                    checkout = checkout.display(),
                    dir = env.dir.display(),
                    passwd = passwd.display(),
                ),
            )
        }
    };
    let login = |cmd: &str| {
        format!(
            "{become_user}env -i PATH=/usr/bin:/bin HOME='{}' USER={} TERM=dumb bash -l -c {}",
            user_home.display(),
            if user.is_some() { "qs" } else { "root" },
            shell_quote(cmd)
        )
    };
    let script = format!(
        "set -e\n\
         ip link set lo up\n\
         mount -t tmpfs tmpfs /usr/local/bin\n\
         mount -t tmpfs tmpfs /usr/local/share\n\
         {add_user}\
         cd '{checkout}'\n\
         {quick_start}\n\
         for i in $(seq 1 1200); do curl -fsS --max-time 2 http://localhost:8765/ >'{page}' 2>/dev/null && break; sleep 0.1; done\n\
         {status}\n",
        checkout = checkout.display(),
        quick_start = login(&line),
        page = env.dir.join("page.html").display(),
        // The next login shell finds it on PATH, and its man page.
        status = login("shinyctl status && man -w shinyctl"),
    );
    let out = Command::new("unshare").args(["--net", "--mount", "--", "bash", "-c", &script]).output().expect("unshare");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Whatever happened, make sure the test's Env ends what the line started.
    let _ = env.run(&["status", "--json"]);
    let _ = env.status();
    assert!(out.status.success(), "the quick start failed:\n{stdout}\n{stderr}");
    assert!(!stderr.contains("command not found"), "{stderr}");
    let page = std::fs::read_to_string(env.dir.join("page.html")).unwrap_or_default();
    // The page says which copy served it once its WebSocket is up; the
    // static page is the example app's, with the line that will say it.
    assert!(
        page.contains("<title>hello</title>") && page.contains("Served by"),
        "http://localhost:8765 is the example app: {page}\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("hello  1"), "a new login shell finds shinyctl on PATH and status lists the app:\n{stdout}");
    let man_dir = if user.is_some() { user_home.display().to_string() + "/.local/" } else { "/usr/local/".to_string() };
    assert!(stdout.lines().any(|l| l.starts_with(&man_dir) && l.ends_with("man1/shinyctl.1")), "man finds the page:\n{stdout}");
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}
