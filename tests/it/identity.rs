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

/// The app of a daemon that is not root: a package from its user's own R
/// library (under a home of mode 0700), a file of that user's it must not
/// read, its own 0600 file, and a 0700 folder of its own in its disk.
const SUBORDINATE_R: &str = r##"
library(shiny)
library(shinyctlprobe)
ui <- function(req) {
  unread <- function(e) "unreadable"
  secret <- tryCatch(readLines(Sys.getenv("SECRET")), warning = unread, error = unread)
  private <- tryCatch(readLines("private.txt"), warning = unread, error = unread)
  d <- file.path(Sys.getenv("SHINYCTL_SCRATCH"), "mine")
  dir.create(d, mode = "0700", showWarnings = FALSE)
  writeLines("x", file.path(d, "f"))
  uid <- system2("id", "-u", stdout = TRUE)
  tags$pre(paste0(c(paste0("uid=", uid), paste0("lib=", probe_hello()), paste0("secret=", secret), paste0("private=", private)), ";", collapse = "\n"))
}
shinyApp(ui, function(input, output) {})
"##;

/// Installs the package `shinyctlprobe` (`probe_hello()`) into R's default
/// user library under `home`, as R computes it for that home.
fn install_user_package(scratch: &std::path::Path, home: &std::path::Path) {
    let pkg = scratch.join("shinyctlprobe");
    std::fs::create_dir_all(pkg.join("R")).unwrap();
    std::fs::write(
        pkg.join("DESCRIPTION"),
        "Package: shinyctlprobe\nVersion: 0.1\nTitle: A Probe\nDescription: A probe.\nLicense: MIT\nAuthor: t\nMaintainer: t <t@example.org>\n",
    )
    .unwrap();
    std::fs::write(pkg.join("NAMESPACE"), "export(probe_hello)\n").unwrap();
    std::fs::write(pkg.join("R/hello.R"), "probe_hello <- function() \"from-user-lib\"\n").unwrap();
    let out = std::process::Command::new("Rscript")
        .args(["-e", "cat(path.expand(Sys.getenv('R_LIBS_USER')))"])
        .env("HOME", home)
        .env_remove("R_LIBS_USER")
        .output()
        .unwrap();
    let lib = std::path::PathBuf::from(String::from_utf8(out.stdout).unwrap());
    assert!(lib.starts_with(home), "R's user library is below the home: {lib:?}");
    std::fs::create_dir_all(&lib).unwrap();
    let out = std::process::Command::new("R").args(["CMD", "INSTALL", "-l"]).arg(&lib).arg(&pkg).output().unwrap();
    assert!(out.status.success(), "R CMD INSTALL: {}", String::from_utf8_lossy(&out.stderr));
}

/// A daemon that is not root, whose user has subordinate ids: each app
/// runs as one of them, reads its user's R library but not its user's
/// files, and what it wrote is removed with the app.
#[test]
fn an_unprivileged_daemon_with_subordinate_ids_runs_each_app_as_one_of_them() {
    if !needs_root("it makes a user with subordinate ids") {
        return;
    }
    let env = Env::new("subids");
    let home = crate::fence::UserHome::new("subids");
    let user = TestUser::create(Some(&home.0));
    // Its ranges (userdel -f takes them away).
    let ranges = user.subordinate_ids();
    install_user_package(&env.dir, &home.0);
    let secret = home.0.join("secret.txt");
    std::fs::write(&secret, "the user's own\n").unwrap();
    let app = unique("subids");
    let port = free_port();
    let manifest = env.app_running(SUBORDINATE_R, &app, port, &format!("warm-replicas: 0\nenv:\n  SECRET: \"{}\"\n", secret.display()));
    std::fs::write(manifest.with_file_name("private.txt"), "only-mine\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(manifest.with_file_name("private.txt"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    for dir in [&home.0, &env.dir] {
        assert!(std::process::Command::new("chown").arg("-R").arg(format!("{0}:{0}", user.name)).arg(dir).status().unwrap().success());
    }
    std::fs::set_permissions(&home.0, std::fs::Permissions::from_mode(0o700)).unwrap();
    let mut cmd = std::process::Command::new("setpriv");
    cmd.args(["--reuid", &user.name, "--regid", &user.name, "--clear-groups", bin(), "serve"])
        .env("HOME", &home.0)
        .env_remove("XDG_STATE_HOME")
        .env_remove("SHINYCTL_IDS")
        .env_remove("R_LIBS_USER");
    env.start_daemon(cmd);
    env.apply(&manifest);
    env.wait_roles(&app, "1:active", Duration::from_secs(60));
    let page = wait_http_ok(port, Duration::from_secs(10)).body;

    let status = env.status();
    assert!(status.get("own_user").is_none(), "the copies have ids of their own: {status}");
    let uid = status["apps"][0]["uid"].as_u64().expect("the app's own uid in status --json") as u32;
    assert!(ranges.iter().any(|r| (r.0..=r.1).contains(&uid)), "one of its user's subordinate ids {ranges:?}: {uid}");
    assert_eq!(between(&page, "uid=", ";"), Some(uid.to_string().as_str()), "R runs as it: {page}");
    let r = env.pid_of(&app, 1);
    let host = std::fs::read_to_string(format!("/proc/{r}/status")).unwrap();
    assert!(host.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some(&uid.to_string())), "on the host too");
    assert_eq!(between(&page, "lib=", ";"), Some("from-user-lib"), "its user's R library, under a 0700 home: {page}");
    assert_eq!(between(&page, "secret=", ";"), Some("unreadable"), "its user's own file is not its: {page}");
    assert_eq!(between(&page, "private=", ";"), Some("only-mine"), "the app's own 0600 file, in its release: {page}");
    let scratch = env.home().join(format!("scratch/default-{app}"));
    let mine = std::fs::metadata(scratch.join("1/mine")).unwrap();
    assert_eq!((mine.uid(), mine.mode() & 0o777), (uid, 0o700), "a folder the app makes is its uid's");

    // The next R of the copy, as the app's uid, removes the tempdir() the
    // killed one left in the copy's /tmp.
    killed_r_leaves_no_tempdir(&env, &app, r);

    // Deleted: what it wrote goes too, though its user could not remove it
    // (nor its folder set aside to be removed).
    env.ok(&["delete", &app]);
    let left = || -> Vec<String> {
        std::fs::read_dir(env.home().join("scratch"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(&app))
            .collect()
    };
    wait_until(Duration::from_secs(30), "the app's disks removed", || left().is_empty().then_some(()));
}
