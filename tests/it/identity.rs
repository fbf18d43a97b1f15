//! Each app's identity on the machine (README, "Identities"): a root
//! daemon's fenced copy runs as the app's own uid, inside its namespace and
//! out, and is no one on the host: tried from inside a real R app.

use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use crate::helpers::*;

/// Each page says what the copy is and may do on the host, as
/// `key=value;` lines: its uid inside, whether it reads /etc/shadow, the
/// owner and mode of a setuid file it makes in its disk, and whether it
/// writes a folder given by `WRITE_TO`.
const PROBE_R: &str = r##"
library(shiny)
yes <- function(x) if (isTRUE(x)) "yes" else "no"
ui <- function(req) {
  shadow <- yes(tryCatch(length(readBin("/etc/shadow", "raw", 16)) > 0, error = function(e) FALSE, warning = function(w) FALSE))
  f <- file.path(Sys.getenv("SHINYCTL_SCRATCH"), "setuid-me")
  writeLines("#!/bin/sh", f)
  Sys.chmod(f, "4755", use_umask = FALSE)
  to <- Sys.getenv("WRITE_TO")
  wrote <- if (nzchar(to)) yes(tryCatch(file.create(file.path(to, "from-app")), warning = function(w) FALSE, error = function(e) FALSE)) else "-"
  uid <- system2("id", "-u", stdout = TRUE)
  private <- tryCatch(readLines("private.txt"), warning = function(w) "unreadable", error = function(e) "unreadable")
  tags$pre(paste0(c(paste0("uid=", uid), paste0("shadow=", shadow), paste0("wrote=", wrote), paste0("private=", private)), ";", collapse = "\n"))
}
shinyApp(ui, function(input, output) {})
"##;

#[test]
fn a_root_daemons_copy_is_no_one_on_the_host() {
    assert!(nix::unistd::geteuid().is_root(), "this test needs a root daemon (CI runs as root)");
    let env = Env::new("identity");
    let app = unique("ident");
    let port = free_port();
    // A folder the app is told it may write, which its uid may not (yet).
    let data = std::path::PathBuf::from(format!("/var/tmp/shinyctl-it-{}-identity-data", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);
    std::fs::create_dir_all(&data).unwrap();
    let extra = format!("warm-replicas: 0\nsandbox:\n  writable-paths: [\"{0}\"]\nenv:\n  WRITE_TO: \"{0}\"\n", data.display());
    let manifest = env.app_running(PROBE_R, &app, port, &extra);
    // A file of the app's that only its owner (root here) may read: the
    // release is the app's, so its copies read it.
    let private = manifest.with_file_name("private.txt");
    std::fs::write(&private, "only-mine\n").unwrap();
    std::fs::set_permissions(&private, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    env.apply(&manifest);
    env.wait_roles(&app, "1:active", Duration::from_secs(60));
    let page = wait_http_ok(port, Duration::from_secs(10)).body;

    let status = env.status();
    let uid = status["apps"][0]["uid"].as_u64().expect("the app's own uid in status --json") as u32;
    assert!(uid >= 0x7F00_0000, "from the reserved range: {uid}");
    assert_eq!(between(&page, "uid=", ";"), Some(uid.to_string().as_str()), "R runs as the app's uid inside: {page}");
    let r = env.pid_of(&app, 1);
    let host_uid = std::fs::read_to_string(format!("/proc/{r}/status")).unwrap();
    assert!(host_uid.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some(&uid.to_string())), "and outside");
    assert_eq!(between(&page, "shadow=", ";"), Some("no"), "/etc/shadow is out of reach: {page}");
    assert_eq!(between(&page, "private=", ";"), Some("only-mine"), "the app's own 0600 file, in its release: {page}");
    let setuid = std::fs::metadata(env.home().join(format!("scratch/default-{app}/1/setuid-me"))).unwrap();
    assert_eq!(setuid.uid(), uid, "a file the app makes is its uid's, never root's");
    assert_eq!(between(&page, "wrote=", ";"), Some("no"), "the folder is root's: {page}");

    // Status names the folder and the fix; the fix works.
    let text = env.ok(&["status", &app]);
    let fix = format!("chown -R {uid}:{uid} {}", data.display());
    assert!(text.contains(&format!("cannot write to {}", data.display())) && text.contains(&fix), "{text}");
    assert!(std::process::Command::new("sh").arg("-c").arg(&fix).status().unwrap().success());
    let page = wait_http_ok(port, Duration::from_secs(10)).body;
    assert_eq!(between(&page, "wrote=", ";"), Some("yes"), "{page}");
    assert!(!env.ok(&["status", &app]).contains("cannot write to"), "the line goes once it can");

    // The same uid through a redeploy and a sleep.
    env.ok(&["restart", &app, "--wait=60s"]);
    assert_eq!(env.status()["apps"][0]["uid"].as_u64(), Some(uid as u64), "kept across redeploys");
    std::fs::remove_dir_all(&data).unwrap();
}
