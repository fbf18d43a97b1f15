//! A copy's log from the app's side (README, "Logs"): the copy writes into
//! a pipe the launcher reads, so it can neither truncate its log (and
//! shinyctl's lines with it) nor stretch it into a sparse file that
//! rotation would copy as real zeros; a line past 64 KiB is ended there;
//! and what the app writes cannot drive the operator's terminal.

use std::time::Duration;

use crate::helpers::*;

/// An app that, before it serves, tries to stretch its log to 3 GiB and
/// to empty it (through a child that inherits R's standard error and
/// output, as a hostile app would), then writes a 200,000-byte line.
const STRETCH_R: &str = r#"
library(shiny)
cat("before-the-stretch\n", file = stderr())
grow <- system("/usr/bin/python3 -c 'import os; os.ftruncate(2, 3 * 2**30)'")
empty <- system("/usr/bin/python3 -c 'import os; os.ftruncate(1, 0)'")
cat(sprintf("stretch-exit=%d empty-exit=%d\n", grow, empty), file = stderr())
cat(strrep("B", 200000), "\n", sep = "", file = stderr())
cat("after-the-stretch\n", file = stderr())
shinyApp(fluidPage("ok"), function(input, output) {})
"#;

#[test]
fn a_copy_can_neither_stretch_nor_empty_its_log_and_a_huge_line_is_cut() {
    let env = Env::new("logstretch");
    let app = unique("stretch");
    let port = free_port();
    let manifest = env.app_running(STRETCH_R, &app, port, "warm-replicas: 0\n");
    env.ok(&["apply", "-f", manifest.to_str().unwrap(), "--wait=90s"]);
    let path = env.home().join(format!("logs/default-{app}.log"));
    let log = wait_until(slow(Duration::from_secs(30)), "the app's last line in its log", || {
        let log = std::fs::read_to_string(&path).ok()?;
        log.contains("after-the-stretch").then_some(log)
    });
    let size = std::fs::metadata(&path).unwrap().len();
    assert!(size < 1 << 20, "the log was not stretched: {size} bytes");
    assert!(log.contains(&format!("--- shinyctl: copy 1 of {app} ")), "shinyctl's own line is still there: {log:.300}");
    assert!(log.contains("before-the-stretch"), "what came before is still there: {log:.300}");
    // Neither ftruncate reached a file: R's standard output and error are a pipe.
    assert!(log.contains("stretch-exit=1 empty-exit=1"), "{}", &log[log.len().saturating_sub(2000)..]);
    let longest = log.lines().map(str::len).max().unwrap();
    assert_eq!(longest, 64 * 1024, "a line past 64 KiB is ended there");
    let long: usize = log.lines().filter(|l| !l.is_empty() && l.bytes().all(|b| b == b'B')).map(str::len).sum();
    assert_eq!(long, 200000, "nothing of the long line is lost");
    let tail = env.ok(&["logs", &app, "-n", "3"]);
    assert!(tail.contains("copy 1 | after-the-stretch\n"), "{tail:.300}");
}

/// An app that fails at start with an error full of terminal controls: a
/// title, a cleared screen, a fake all-clear and hidden text after it.
const CONTROLS_R: &str = r#"
stop("\033]0;PWNED\007\033[2J\033[H\033[32mAll apps healthy\033[0m\033[8m")
"#;

#[test]
fn what_an_app_writes_cannot_drive_the_operators_terminal() {
    let env = Env::new("logcontrols");
    let app = unique("controls");
    let port = free_port();
    let manifest = env.app_running(CONTROLS_R, &app, port, "warm-replicas: 0\n");
    let out = env.run(&["apply", "-f", manifest.to_str().unwrap(), "--wait=60s"]);
    let said = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "the deploy fails: {said}");
    let written_out = r"\x1b]0;PWNED\x07\x1b[2J\x1b[H\x1b[32mAll apps healthy\x1b[0m\x1b[8m";
    assert!(said.contains(written_out) && !said.contains('\x1b'), "apply --wait writes the controls out: {said}");
    let status = env.status_text(Some(&app));
    assert!(status.contains(written_out) && !status.contains('\x1b'), "so does status: {status}");
    // Into a pipe, `logs` gives the bytes as written (for grep and files).
    let logs = env.ok(&["logs", &app, "--all"]);
    assert!(logs.contains("\x1b]0;PWNED\x07"), "{logs}");
}
