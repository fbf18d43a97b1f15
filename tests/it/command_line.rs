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
