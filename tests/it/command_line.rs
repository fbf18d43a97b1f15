//! The command line as people meet it: completions, the man page, and
//! messages that read as a person writes them.

use std::process::Command;
use std::time::Duration;

use crate::helpers::*;

#[test]
fn completions_and_the_man_page_name_every_command() {
    for shell in ["bash", "zsh", "fish"] {
        let out = Command::new(bin()).args(["completions", shell]).output().unwrap();
        assert!(out.status.success(), "completions {shell}");
        let text = String::from_utf8_lossy(&out.stdout);
        for cmd in ["apply", "status", "restart", "delete", "logs", "serve"] {
            assert!(text.contains(cmd), "{shell} completions know {cmd}");
        }
    }
    let bash = Command::new(bin()).args(["completions", "bash"]).output().unwrap();
    let check = Command::new("bash").args(["-n", "-c", &String::from_utf8_lossy(&bash.stdout)]).output().unwrap();
    assert!(check.status.success(), "bash reads it: {}", String::from_utf8_lossy(&check.stderr));
    let bad = Command::new(bin()).args(["completions", "tcsh"]).output().unwrap();
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("possible values: bash, zsh, fish"));

    let man = Command::new(bin()).arg("man").output().unwrap();
    let page = String::from_utf8_lossy(&man.stdout);
    assert!(page.starts_with(".ie") && page.contains(".TH shinyctl 1") && page.contains("apply"), "{page}");
}

#[test]
fn delete_of_a_one_copy_app_says_copy_not_copies() {
    let env = Env::new("cli-one-copy");
    env.started("onecopy", "warm-replicas: 0\n", "1:active");
    let said = env.ok(&["delete", "onecopy", "--now"]);
    assert_eq!(said.trim(), "onecopy: deleted; its 1 copy stops now.");
    wait_until(Duration::from_secs(30), "the app to be gone", || env.copies("onecopy").is_empty().then_some(()));
}

#[test]
fn status_watch_redraws_the_table_every_second_until_interrupted() {
    let env = Env::new("cli-watch");
    env.started("watched", "warm-replicas: 0\n", "1:active");
    let out = std::fs::File::create(env.dir.join("watch.out")).unwrap();
    let mut child = Command::new(bin()).args(["status", "--watch"]).env("SHINYCTL_HOME", env.home()).stdout(out).spawn().unwrap();
    env.track(child.id());
    let frames = |text: &str| text.matches("Every 1s: shinyctl status").count();
    wait_until(Duration::from_secs(20), "three frames of the table", || {
        let text = std::fs::read_to_string(env.dir.join("watch.out")).unwrap_or_default();
        (frames(&text) >= 3).then_some(())
    });
    assert!(child.try_wait().unwrap().is_none(), "it keeps going until interrupted");
    signal(child.id(), 2);
    let status = child.wait().unwrap();
    assert!(!status.success(), "ended by SIGINT");
    let text = std::fs::read_to_string(env.dir.join("watch.out")).unwrap();
    assert!(text.contains("\x1b[H\x1b[2J") && text.contains("watched  1"), "each frame clears the screen and shows the table: {text:?}");
}

#[test]
fn version_flags_print_the_version_as_the_version_command_does() {
    let version = Command::new(bin()).arg("version").output().unwrap();
    assert!(version.status.success());
    let said = String::from_utf8_lossy(&version.stdout).into_owned();
    assert!(said.starts_with("shinyctl ") && said.ends_with('\n'), "{said}");
    for flag in ["--version", "-V"] {
        let out = Command::new(bin()).arg(flag).output().unwrap();
        assert!(out.status.success(), "shinyctl {flag}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(String::from_utf8_lossy(&out.stdout), said, "shinyctl {flag}");
    }
}

/// A manifest of `size` bytes: a valid one padded with a comment.
fn padded_manifest(env: &Env, name: &str, size: usize) -> std::path::PathBuf {
    let manifest = env.app(name, free_port(), "warm-replicas: 0\n");
    let mut text = std::fs::read_to_string(&manifest).unwrap();
    text.push_str("# ");
    text.push_str(&"x".repeat(size.saturating_sub(text.len() + 1)));
    text.push('\n');
    std::fs::write(&manifest, text).unwrap();
    manifest
}

#[test]
fn a_manifest_over_the_apis_limit_is_refused_naming_the_file_and_the_limit() {
    let env = Env::new("cli-big-manifest");
    let big = padded_manifest(&env, "big", 2 << 20);
    let refused = |out: &std::process::Output| {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert!(stderr.contains(&format!("{}: the manifest is too large to apply: 2M", big.display())), "{stderr}");
        assert!(stderr.contains("the API takes at most 1M (1048576 bytes)"), "{stderr}");
        assert!(!stderr.contains("not running"), "{stderr}");
    };
    // No daemon: it is said before one is started.
    refused(&env.run(&["apply", "-f", big.to_str().unwrap()]));
    assert!(!env.home().join("api.sock").exists(), "no daemon was started for a manifest it cannot take");

    // A daemon runs: the same.
    env.started("small", "warm-replicas: 0\n", "1:active");
    refused(&env.run(&["apply", "-f", big.to_str().unwrap()]));

    // The daemon's own answer to a client that sends it anyway.
    let body = env.dir.join("big.json");
    let text = std::fs::read_to_string(&big).unwrap();
    std::fs::write(&body, serde_json::json!({ "path": big.to_str().unwrap(), "text": text }).to_string()).unwrap();
    let out = Command::new("curl")
        .args(["-sS", "-w", "\n%{http_code}", "--unix-socket"])
        .arg(env.home().join("api.sock"))
        .args(["-H", "content-type: application/json", "--data-binary"])
        .arg(format!("@{}", body.display()))
        .arg("http://shinyctl/v1/apply")
        .output()
        .unwrap();
    let answer = String::from_utf8_lossy(&out.stdout);
    assert!(answer.ends_with("\n413"), "413 Payload Too Large: {answer}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(answer.contains("the apply request is too large: this API takes at most 1M (1048576 bytes)"), "{answer}");
    assert!(env.status()["apps"].as_array().unwrap().iter().all(|a| a["name"] != "big"));
}

#[test]
fn only_a_socket_nothing_listens_on_means_serve_is_not_running() {
    let env = Env::new("cli-transport");
    let sock = env.home().join("api.sock");
    let status = || {
        let out = env.run(&["status"]);
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // No socket, and a socket left by a process that ended.
    assert!(status().contains("shinyctl serve is not running (nothing answers on"), "no socket");
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    assert!(sock.exists());
    assert!(status().contains("shinyctl serve is not running (nothing answers on"), "a socket nobody listens on");

    // Something listens, and closes each connection without an answer.
    std::fs::remove_file(&sock).unwrap();
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let closer = std::thread::spawn(move || {
        for conn in listener.incoming().take(1) {
            drop(conn);
        }
    });
    let said = status();
    closer.join().unwrap();
    assert!(!said.contains("not running"), "{said}");
    assert!(said.contains(&format!("talking to shinyctl serve on {} failed:", sock.display())), "{said}");
}

#[test]
fn host_localhost_serves_on_127_0_0_1() {
    let env = Env::new("cli-localhost");
    let port = env.started("local", "host: localhost\nwarm-replicas: 0\n", "1:active");
    assert_eq!(get(port, "/", &[]).unwrap().status, 200, "served on 127.0.0.1");
    let listening = std::fs::read_to_string("/proc/net/tcp").unwrap();
    // 0100007F is 127.0.0.1 as the kernel writes it; the port in hex.
    let at = format!("0100007F:{port:04X}");
    assert!(listening.lines().any(|l| l.split_whitespace().nth(1) == Some(at.as_str())), "listens on 127.0.0.1:{port} only");
}

#[test]
fn a_root_daemon_says_its_copies_run_as_root_in_status_json_not_under_every_table() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs a root daemon (CI runs as root)");
        return;
    }
    let env = Env::new("cli-root-note");
    env.started("rooted", "warm-replicas: 0\n", "1:active");
    let table = env.ok(&["status"]);
    assert!(!table.contains("as root") && !table.contains("run-as"), "not under the table:\n{table}");
    let app = env.status()["apps"].as_array().unwrap().iter().find(|a| a["name"] == "rooted").cloned().unwrap();
    let said = app["runs_as_root"].as_str().unwrap_or_default();
    assert!(said.starts_with("its copies run as root, inside a user namespace") && said.contains("run-as: USER"), "{app}");
    assert!(!app["notes"].to_string().contains("as root"), "{app}");
}
