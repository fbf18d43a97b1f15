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
        for hidden in ["launch", "proxy", "man"] {
            let offered = [format!(" {hidden} "), format!("'{hidden}:"), format!("-a \"{hidden}\""), format!(",{hidden})")];
            assert!(!offered.iter().any(|o| text.contains(o.as_str())), "{shell} completions offer no {hidden}:\n{text}");
        }
    }
    let bash = Command::new(bin()).args(["completions", "bash"]).output().unwrap();
    let check = Command::new("bash").args(["-n", "-c", &String::from_utf8_lossy(&bash.stdout)]).output().unwrap();
    assert!(check.status.success(), "bash reads it: {}", String::from_utf8_lossy(&check.stderr));
    let bad = Command::new(bin()).args(["completions", "tcsh"]).output().unwrap();
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("possible values: bash, zsh, fish"));

    let man = Command::new(bin()).arg("man").output().unwrap();
    let page = String::from_utf8_lossy(&man.stdout);
    assert!(page.starts_with(".ie") && page.contains(".TH SHINYCTL 1") && page.contains("apply"), "{page}");
}

/// The visible commands, as `shinyctl --help` lists them (`help` left out).
fn visible_commands() -> Vec<String> {
    let help = Command::new(bin()).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout).into_owned();
    let listed = help.split("Commands:\n").nth(1).expect("--help lists the commands");
    let names = listed.lines().take_while(|l| !l.trim().is_empty()).filter_map(|l| l.split_whitespace().next());
    names.filter(|n| *n != "help").map(str::to_string).collect()
}

/// `shinyctl man`, as `man` shows it (plain text, lines unbroken).
fn man_page() -> String {
    let page = Command::new(bin()).arg("man").output().unwrap();
    let file = std::env::temp_dir().join(format!("shinyctl-man-{}.1", std::process::id()));
    std::fs::write(&file, &page.stdout).unwrap();
    let shown = Command::new("man").arg("-l").arg(&file).env("MANWIDTH", "1000").env("MAN_KEEP_FORMATTING", "0").output().unwrap();
    let _ = std::fs::remove_file(&file);
    assert!(shown.status.success(), "man reads it: {}", String::from_utf8_lossy(&shown.stderr));
    // man may still mark bold by overstriking when it writes to a pipe.
    let text = String::from_utf8_lossy(&shown.stdout).into_owned();
    let mut plain = String::new();
    for c in text.chars() {
        if c == '\u{8}' {
            plain.pop();
        } else {
            plain.push(c);
        }
    }
    plain
}

/// The text of a man page's section, from its heading to the next one.
fn section<'a>(page: &'a str, title: &str) -> &'a str {
    let start = page.find(&format!("\n{title}\n")).unwrap_or_else(|| panic!("a {title} section:\n{page}"));
    let body = &page[start + title.len() + 2..];
    let end = body.lines().take_while(|l| l.is_empty() || l.starts_with(' ')).map(|l| l.len() + 1).sum::<usize>();
    &body[..end.min(body.len())]
}

#[test]
fn the_man_page_has_every_command_the_manifest_keys_files_environment_and_exit_status() {
    let page = man_page();
    let synopsis = section(&page, "SYNOPSIS");
    let commands = visible_commands();
    assert!(commands.len() >= 9, "{commands:?}");
    for cmd in &commands {
        let line = format!("shinyctl {cmd}");
        assert!(synopsis.lines().any(|l| l.trim() == line || l.trim().starts_with(&format!("{line} "))), "{line} in:\n{synopsis}");
        assert!(section(&page, "COMMANDS").lines().any(|l| l.trim().starts_with(&line)), "{cmd} described");
    }
    for hidden in ["launch", "proxy", "man"] {
        assert!(!page.contains(&format!("shinyctl {hidden}")), "no hidden {hidden}:\n{synopsis}");
    }
    let manifest = section(&page, "MANIFEST");
    let keys = shinyctl::manifest::KEYS.iter().map(|k| k.to_string());
    for key in keys.chain(shinyctl::manifest::SANDBOX_KEYS.iter().map(|k| format!("sandbox.{k}"))) {
        let entry = manifest.lines().find(|l| l.split_whitespace().next() == Some(key.as_str()));
        assert!(entry.is_some_and(|l| l.contains("(default: ") || l.contains("(required)")), "{key} in:\n{manifest}");
    }
    assert!(section(&page, "FILES").contains("~/.shinyctl/api.sock"));
    let environment = section(&page, "ENVIRONMENT");
    for var in ["SHINYCTL_HOME", "SHINYCTL_METRICS", "SHINYCTL_LOG", "NOTIFY_SOCKET"] {
        assert!(environment.contains(var), "{var} in:\n{environment}");
    }
    let exit = section(&page, "EXIT STATUS");
    assert!(["0", "1", "2"].iter().all(|n| exit.lines().any(|l| l.trim_start().starts_with(&format!("{n} ")))), "{exit}");

    // Every page it points to exists: shinyctl-apply(1) and the like, none.
    // (SHINYCTL(1), in the page's header and footer, is this page.)
    for (name, n) in man_references(&page).into_iter().filter(|(name, n)| !(name.eq_ignore_ascii_case("shinyctl") && n == "1")) {
        let found = Command::new("man").args(["-w", &n, &name]).output().unwrap();
        assert!(found.status.success(), "the page points to {name}({n}), which man does not have");
    }
}

/// Every `name(N)` a page points to.
fn man_references(page: &str) -> Vec<(String, String)> {
    let b = page.as_bytes();
    let mut refs = Vec::new();
    for i in 0..b.len().saturating_sub(2) {
        if b[i] == b'(' && b[i + 1].is_ascii_digit() && b[i + 2] == b')' {
            let start = page[..i].rfind(|c: char| !(c.is_ascii_alphanumeric() || "._-".contains(c))).map_or(0, |s| s + 1);
            if start < i {
                refs.push((page[start..i].to_string(), page[i + 1..i + 2].to_string()));
            }
        }
    }
    refs
}

#[test]
fn man_references_are_found_wherever_they_stand() {
    let refs = man_references("see shinyctl-apply(1)). Or (systemd.unit(5), x) and (1) alone");
    assert_eq!(refs, vec![("shinyctl-apply".to_string(), "1".to_string()), ("systemd.unit".to_string(), "5".to_string())]);
}

/// What bash offers for `words` (the last one being completed), with the
/// completion script of `shinyctl completions bash` loaded and this home.
fn complete(env: &Env, words: &[&str]) -> Vec<String> {
    let script = Command::new(bin()).args(["completions", "bash"]).output().unwrap();
    let file = env.dir.join("completion.bash");
    std::fs::write(&file, &script.stdout).unwrap();
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let program = format!(
        ". '{file}'\nCOMP_WORDS=('{bin}' {words})\nCOMP_CWORD={cword}\nCOMP_LINE=\"${{COMP_WORDS[*]}}\"\nCOMP_POINT=${{#COMP_LINE}}\n\
         complete -p shinyctl | grep -q _shinyctl_with_app_names || exit 7\n\
         _shinyctl_with_app_names \"${{COMP_WORDS[0]}}\" \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"\n\
         printf '%s\\n' \"${{COMPREPLY[@]}}\"\n",
        file = file.display(),
        bin = bin(),
        words = quoted.join(" "),
        cword = words.len(),
    );
    let out = Command::new("bash").arg("-c").arg(&program).env("SHINYCTL_HOME", env.home()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut offered: Vec<String> = String::from_utf8_lossy(&out.stdout).lines().filter(|l| !l.is_empty()).map(str::to_string).collect();
    offered.sort();
    offered
}

#[test]
fn bash_completes_visible_commands_and_app_names() {
    let env = Env::new("cli-complete");
    env.started("web", "warm-replicas: 0\n", "1:active");
    env.started("worker", "warm-replicas: 0\n", "1:active");
    let apps = vec!["web".to_string(), "worker".to_string()];

    let commands = complete(&env, &[""]);
    assert!(commands.contains(&"apply".to_string()) && commands.contains(&"status".to_string()), "{commands:?}");
    for hidden in ["launch", "proxy", "man"] {
        assert!(!commands.contains(&hidden.to_string()), "{hidden} is not offered: {commands:?}");
    }
    for cmd in ["restart", "rollback", "delete", "logs", "status"] {
        assert_eq!(complete(&env, &[cmd, ""]), apps, "shinyctl {cmd} <TAB>");
    }
    assert_eq!(complete(&env, &["restart", "wo"]), vec!["worker".to_string()]);
    assert_eq!(complete(&env, &["restart", "--now", ""]), apps, "after a flag");
    assert!(complete(&env, &["logs", "--copy", ""]).iter().all(|w| !apps.contains(w)), "the copy's number is no app");
    assert_eq!(complete(&env, &["logs", "--copy", "2", ""]), apps, "after an option's value");
    assert!(complete(&env, &["restart", "web", ""]).iter().all(|w| !apps.contains(w)), "one app only");
    assert!(complete(&env, &["apply", ""]).iter().all(|w| !apps.contains(w)), "apply takes a file");
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
    let mut cmd = Command::new(bin());
    cmd.args(["status", "--watch"]).env("SHINYCTL_HOME", env.home()).stdout(out);
    // As from a terminal: SIGINT at its default, whatever this test run
    // inherited (a background job of a shell without job control starts
    // with it ignored, and so would the command).
    // SAFETY: signal(2) to SIG_DFL only, between fork and exec.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
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
    assert!(unsafe { libc::geteuid() } == 0, "this test needs a root daemon (CI runs as root)");
    let env = Env::new("cli-root-note");
    env.started("rooted", "warm-replicas: 0\nsandbox:\n  mode: off\n", "1:active");
    env.started("fencedapp", "warm-replicas: 0\n", "1:active");
    let table = env.ok(&["status"]);
    assert!(!table.contains("as root") && !table.contains("run-as"), "not under the table:\n{table}");
    let app = |name: &str| env.status()["apps"].as_array().unwrap().iter().find(|a| a["name"] == name).cloned().unwrap();
    let rooted = app("rooted");
    let said = rooted["runs_as_root"].as_str().unwrap_or_default();
    assert!(said.starts_with("its copies run as root, with no fence") && said.contains("run-as: USER"), "{rooted}");
    assert!(!rooted["notes"].to_string().contains("as root"), "{rooted}");
    let fenced = app("fencedapp");
    assert!(fenced["runs_as_root"].is_null() && fenced["uid"].as_u64().is_some(), "a fenced app runs as its own uid: {fenced}");
}

#[test]
fn a_command_whose_reader_goes_ends_quietly_rather_than_panicking() {
    use std::os::unix::process::ExitStatusExt;
    // `shinyctl status --watch | head -3`: the reader closes early. The
    // bash completion script is longer than a pipe holds.
    let mut child = std::process::Command::new(bin())
        .args(["completions", "bash"])
        .env("SHINYCTL_HOME", "/nonexistent")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "ended by SIGPIPE, as `yes | head` is: {:?}", out.status);
}
