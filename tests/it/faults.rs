//! The faults issue with real R: what a broken or idle app costs the machine.

use std::time::{Duration, Instant};

use crate::helpers::*;

/// An app whose copy 2 dies at every start (copy 1 serves).
const CRASHING_COPY_2: &str = r#"if (Sys.getenv("SHINYCTL_COPY") == "2") stop("copy 2 is broken on purpose")
library(shiny)
shinyApp(fluidPage(textOutput("copy")), function(input, output) output$copy <- renderText(Sys.getenv("SHINYCTL_COPY")))
"#;

#[test]
fn an_idle_app_with_a_crash_looping_copy_goes_to_sleep() {
    let env = Env::new("faults-crashloop-sleep");
    let port = free_port();
    let manifest = env.app_running(CRASHING_COPY_2, "loopnap", port, "idle-timeout: 20s\n");
    env.apply(&manifest);

    // Copy 1 serves while copy 2 crash-loops.
    env.wait_roles("loopnap", "1:active", Duration::from_secs(60));
    wait_until(Duration::from_secs(60), "copy 2 to crash more than once", || {
        env.copies("loopnap").iter().any(|c| c.copy == 2 && c.crashes >= 2).then_some(())
    });
    let pid1 = env.pid_of("loopnap", 1);
    let text = env.ok(&["status", "loopnap"]);
    assert!(
        text.contains("loopnap: copy 2 is crash-looping")
            && text.contains("Its last error: \"Error")
            && text.contains("copy 2 is broken on purpose"),
        "the line under the table quotes the copy's last error: {text}"
    );

    // No request: idle-timeout after the deploy, the app sleeps although
    // copy 2 keeps restarting.
    env.wait_asleep("loopnap", Duration::from_secs(90));
    wait_gone(pid1, Duration::from_secs(15), "copy 1's R process to stop");

    // Asleep, the broken copy is not started again: its log gets no new
    // start for longer than its backoff (at most 8 s after 3 crashes here,
    // 16 s after 4; the check covers 20 s).
    let starts = env.starts("default-loopnap@2.log").len();
    assert!(starts >= 2, "copy 2 was started several times: {starts}");
    let until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < until {
        assert_eq!(env.starts("default-loopnap@2.log").len(), starts, "a sleeping app restarted its broken copy");
        assert!(env.copies("loopnap").iter().all(|c| c.status == "asleep"), "{}", env.ok(&["status"]));
        std::thread::sleep(Duration::from_millis(500));
    }

    // The first request wakes it, and copy 1 serves again.
    let r = get(port, "/", &[]).unwrap();
    assert_eq!(r.status, 200, "woken by a request: {r:?}");
}

#[test]
fn after_the_binary_is_replaced_the_daemon_still_starts_a_load_balancer() {
    let env = Env::new("faults-replaced-binary");
    // "Installed" shinyctl: a copy of the binary under test.
    let bin_dir = env.dir.join("bin");
    std::fs::create_dir_all(&bin_dir).unwrap();
    let installed = bin_dir.join("shinyctl");
    std::fs::copy(bin(), &installed).unwrap();
    let port = free_port();
    let manifest = env.app("swapped", port, "warm-replicas: 0\n");
    let out = env.run_binary(&installed, &["apply", "-f", manifest.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    env.wait_roles("swapped", "1:active", Duration::from_secs(60));
    wait_http_ok(port, Duration::from_secs(10));
    let old_proxy = env.status()["proxy_pid"].as_u64().expect("a load balancer runs") as u32;

    // install.sh renames a new binary over the old one; here, a file that
    // is no shinyctl at all, so only the running binary itself can serve.
    let tmp = bin_dir.join(".shinyctl.new");
    std::fs::write(&tmp, "#!/bin/sh\nexit 99\n").unwrap();
    std::fs::rename(&tmp, &installed).unwrap();

    signal(old_proxy, 9);
    let new_proxy = wait_until(Duration::from_secs(30), "a new load balancer", || {
        let p = env.status()["proxy_pid"].as_u64()? as u32;
        (p != old_proxy && pid_alive(p)).then_some(p)
    });
    assert_eq!(cmdline(new_proxy), format!("{} proxy", installed.display()), "argv[0] is still the installed path");
    assert_eq!(wait_http_ok(port, Duration::from_secs(10)).status, 200);
}

#[test]
fn a_woken_app_with_an_idle_timeout_shorter_than_its_start_answers_what_it_held() {
    // R takes longer than 1 s to load shiny: the held requests must still be
    // answered by the woken copy, not put back to sleep before they reach it.
    let env = Env::new("faults-short-idle");
    let port = free_port();
    env.apply(&env.app("blink", port, "idle-timeout: 1s\nwarm-replicas: 0\n"));
    env.wait_asleep("blink", Duration::from_secs(60));
    for round in 0..2 {
        let clients: Vec<_> = (0..3).map(|_| std::thread::spawn(move || get(port, "/", &[]).map(|r| r.status))).collect();
        for c in clients {
            assert_eq!(c.join().unwrap().unwrap(), 200, "round {round}: every held request is answered by the woken copy");
        }
        env.wait_asleep("blink", Duration::from_secs(60));
    }
}

/// `state-file` naming a file that is not a shinyctl state file (here the
/// app's own app.R) is refused at apply, and the file is left as it was.
#[test]
fn a_state_file_that_is_not_shinyctls_is_refused_at_apply() {
    let env = Env::new("faults-statefile-foreign");
    let manifest = env.app("foreignstate", free_port(), "state-file: app.R\n");
    let app_r = manifest.with_file_name("app.R");
    let before = std::fs::read(&app_r).unwrap();
    let out = env.run(&["apply", "-f", manifest.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "apply must fail: {err}");
    assert!(
        err.contains("app.yaml:3: state-file:") && err.contains("is not a shinyctl state file") && err.contains("app.R"),
        "the error names the file, line, key and why: {err}"
    );
    assert_eq!(std::fs::read(&app_r).unwrap(), before, "app.R was not touched");
    assert!(env.status()["apps"].as_array().is_none_or(|a| a.is_empty()), "nothing was applied");
}

/// Two apps whose `<app-group>-<app-name>` would be the same log file name
/// are refused.
#[test]
fn apps_that_would_share_a_log_file_are_refused() {
    let env = Env::new("faults-log-names");
    let name = unique("logname");
    let first = env.app(&name, free_port(), "app-group: a-b\n");
    env.apply(&first);
    let second = env.app(&format!("b-{name}"), free_port(), "app-group: a\n");
    let out = env.run(&["apply", "-f", second.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "apply must fail: {err}");
    assert!(err.contains("app-group:") && err.contains(&format!("logs/a-b-{name}.log")), "{err}");
}

/// Starts `shinyctl serve` in a mount namespace of its own in which `dir`
/// is read-only (CI runs as root, for whom file modes don't stop a write);
/// returns the daemon's PID once its API answers.
fn daemon_with_read_only(env: &Env, dir: &std::path::Path) -> u32 {
    let d = dir.display();
    let script = format!("mount --bind '{d}' '{d}' && mount -o remount,ro,bind '{d}' && exec '{}' serve", bin());
    let mut cmd = std::process::Command::new("unshare");
    cmd.args(["-m", "--propagation", "private", "sh", "-c", &script]);
    env.start_daemon(cmd)
}

/// A state-file in a read-only folder is refused at apply with the reason;
/// a state-file that stops being writable later keeps the previous file
/// whole, puts a line under the table, and the copies keep running.
#[test]
fn a_state_file_that_cannot_be_written_is_refused_or_reported() {
    let env = Env::new("faults-statefile-ro");
    let ro = env.dir.join("ro");
    std::fs::create_dir_all(&ro).unwrap();
    let daemon = daemon_with_read_only(&env, &ro);

    let manifest = env.app(&unique("rostate"), free_port(), &format!("state-file: {}/state.json\n", ro.display()));
    let out = env.run(&["apply", "-f", manifest.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "apply must fail: {err}");
    assert!(err.contains("state-file:") && err.contains("cannot write the state file in") && err.contains("Read-only"), "{err}");
    assert!(env.status()["apps"].as_array().is_none_or(|a| a.is_empty()), "nothing was applied");

    // Later: a writable folder that becomes read-only while the app runs.
    let later = env.dir.join("later");
    std::fs::create_dir_all(&later).unwrap();
    let name = unique("latestate");
    let port = free_port();
    let state_file = later.join("state.json");
    env.apply(&env.app(&name, port, &format!("state-file: {}\nreplicas: 1\nwarm-replicas: 1\n", state_file.display())));
    env.wait_roles(&name, "1:active 2:warm", Duration::from_secs(60));
    let saved = std::fs::read(&state_file).unwrap();
    let l = later.display();
    let remount = std::process::Command::new("nsenter")
        .args(["-t", &daemon.to_string(), "-m", "sh", "-c", &format!("mount --bind '{l}' '{l}' && mount -o remount,ro,bind '{l}'")])
        .status()
        .unwrap();
    assert!(remount.success(), "made the folder read-only for the daemon");
    // A copy's death changes the state, which can no longer be recorded.
    let warm = env.pid_of(&name, 2);
    signal(warm, 9);
    wait_until(Duration::from_secs(30), "the line under the table", || {
        let text = env.ok(&["status", &name]);
        text.contains(&format!("{name}: cannot write its state file {}", state_file.display())).then_some(())
    });
    assert_eq!(std::fs::read(&state_file).unwrap(), saved, "the previous state file is whole");
    assert!(serde_json::from_slice::<serde_json::Value>(&saved).is_ok());
    assert_eq!(get(port, "/", &[]).unwrap().status, 200, "the app keeps serving");
    // The killed copy is restarted all the same (a state change that is
    // only in memory until the folder can be written again).
    wait_until(Duration::from_secs(60), "copy 2 to be restarted", || {
        env.copies(&name).iter().any(|c| c.copy == 2 && c.pid.is_some_and(|p| p != warm) && c.ready).then_some(())
    });
}

/// The launcher PIDs (what the daemon records) of an app's copies, by copy.
fn launchers(env: &Env, app: &str) -> Vec<(u32, u32)> {
    let status = env.status();
    let apps = status["apps"].as_array().cloned().unwrap_or_default();
    let copies = apps.iter().find(|a| a["name"] == app).map(|a| a["copies"].as_array().cloned().unwrap_or_default()).unwrap_or_default();
    copies.iter().filter_map(|c| Some((c["copy"].as_u64()? as u32, c["launcher_pid"].as_u64()? as u32))).collect()
}

/// The processes of this home that are copy launchers (the marker in their
/// command line), not counting their own clones (each copy's init).
fn running_launchers(env: &Env) -> Vec<u32> {
    let all: Vec<u32> = pids_with_home(&env.home()).into_iter().filter(|&p| cmdline(p).contains(" launch ")).collect();
    all.iter().copied().filter(|&p| !all.contains(&shinyctl::sys::procfs::parent_of(p).unwrap_or(0))).collect()
}

/// A daemon SIGKILLed between starting a copy and recording its process
/// leaves a copy no record names. The next daemon adopts it when the
/// copy's record waits for a process (recorded before the start), and stops
/// it when no record names it at all; each with a line in api.log.
#[test]
fn copies_no_record_names_are_adopted_or_stopped_by_the_next_daemon() {
    let env = Env::new("faults-unrecorded");
    let name = unique("unrec");
    let port = env.started(&name, "", "1:active 2:warm");
    let before = launchers(&env, &name);
    let (one, two) = (before.iter().find(|c| c.0 == 1).unwrap().1, before.iter().find(|c| c.0 == 2).unwrap().1);
    let daemon = env.status()["daemon_pid"].as_u64().unwrap() as u32;
    signal(daemon, 9);
    wait_gone(daemon, Duration::from_secs(10), "the killed daemon");

    // As the killed daemon could have left it: copy 1 recorded without its
    // process yet; copy 2 not recorded at all.
    let state_file = env.dir.join("apps").join(&name).join("state.json");
    let mut state: serde_json::Value = serde_json::from_slice(&std::fs::read(&state_file).unwrap()).unwrap();
    let copies = state["copies"].as_array_mut().unwrap();
    copies.retain(|c| c["copy"] != 2);
    for c in copies.iter_mut().filter(|c| c["copy"] == 1) {
        c["pid"] = serde_json::Value::Null;
        c["pid_start"] = serde_json::Value::Null;
    }
    std::fs::write(&state_file, serde_json::to_vec_pretty(&state).unwrap()).unwrap();

    env.ok(&["serve", "-d"]);
    wait_gone(two, Duration::from_secs(20), "the copy no record names to be stopped");
    let after = launchers(&env, &name);
    assert!(after.contains(&(1, one)), "copy 1 adopted, the same process: {after:?}");
    assert_eq!(get(port, "/", &[]).unwrap().status, 200);
    let log = std::fs::read_to_string(env.home().join("api.log")).unwrap();
    assert!(log.contains(&format!("adopted copy 1 of {name}")), "{log}");
    assert!(log.contains(&format!("stopping copy 2 of {name} (PID {two}): no record of it names it")), "{log}");
    wait_until(Duration::from_secs(60), "a new warm copy", || {
        let c = env.copies(&name);
        (c.iter().any(|c| c.role == "warm" && c.ready) && c.iter().all(|c| c.copy != 2)).then_some(())
    });
    let known: Vec<u32> = launchers(&env, &name).into_iter().map(|(_, p)| p).collect();
    let mut running = running_launchers(&env);
    running.sort();
    let mut known_sorted = known.clone();
    known_sorted.sort();
    assert_eq!(running, known_sorted, "every running copy is one status shows");
}

/// The same fault for real: the daemon SIGKILLed the moment a copy's
/// launcher appears. Whatever it had recorded, the next daemon leaves no
/// copy that status does not show.
#[test]
fn a_daemon_killed_right_after_starting_a_copy_leaves_no_orphan() {
    let env = Env::new("faults-kill-at-start");
    let name = unique("killstart");
    let port = free_port();
    env.apply(&env.app(&name, port, ""));
    let daemon = env.status()["daemon_pid"].as_u64().unwrap() as u32;
    wait_until(Duration::from_secs(30), "a copy launcher", || (!running_launchers(&env).is_empty()).then_some(()));
    signal(daemon, 9);
    wait_gone(daemon, Duration::from_secs(10), "the killed daemon");
    env.ok(&["serve", "-d"]);
    env.wait_roles(&name, "1:active 2:warm", Duration::from_secs(90));
    wait_http_ok(port, Duration::from_secs(10));
    wait_until(Duration::from_secs(30), "only the copies status shows", || {
        let mut known: Vec<u32> = launchers(&env, &name).into_iter().map(|(_, p)| p).collect();
        let mut running = running_launchers(&env);
        known.sort();
        running.sort();
        (known == running).then_some(())
    });
}

/// A tmpfs mounted on a folder for one test, unmounted (lazily, as the
/// processes that have files on it may outlive the test by a moment) when
/// dropped.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(on: &std::path::Path, size: &str) -> Tmpfs {
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700"), "tmpfs"])
            .arg(on)
            .status()
            .expect("mount runs");
        assert!(ok.success(), "mounted a {size} tmpfs on {} (the suite runs as root)", on.display());
        Tmpfs(on.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// An app that writes a line to its log on every page load.
const CHATTY_APP_R: &str = r#"
library(shiny)
ui <- function(req) {
  cat("page load\n")
  message("page load, on stderr")
  fluidPage(tags$p(paste0("copy=", Sys.getenv("SHINYCTL_COPY"), ";")))
}
shinyApp(ui, function(input, output, session) {})
"#;

/// The whole SHINYCTL_HOME (logs, api.log, registry, scratch disks,
/// releases) on a disk that fills up: the copies keep answering though
/// their logs can't grow, a copy that dies comes back and takes visitors
/// again, the spare stands in meanwhile, and the daemon answers status.
#[test]
fn a_full_disk_stops_no_copy_and_a_dead_one_comes_back() {
    let env = Env::new("faults-disk-full");
    let _disk = Tmpfs::mount(&env.home(), "16m");
    let name = unique("diskfull");
    let port = free_port();
    let manifest = env.app_running(CHATTY_APP_R, &name, port, "replicas: 1\nwarm-replicas: 1\n");
    env.apply(&manifest);
    env.wait_roles(&name, "1:active 2:warm", Duration::from_secs(60));
    wait_http_ok(port, Duration::from_secs(10));

    // Fill the disk to the last byte.
    let filler = env.home().join("filler");
    let mut f = std::fs::File::create(&filler).unwrap();
    let chunk = vec![0u8; 64 << 10];
    let err = loop {
        if let Err(e) = std::io::Write::write_all(&mut f, &chunk) {
            break e;
        }
    };
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "the disk is full: {err}");
    let _ = std::io::Write::write_all(&mut f, &[0u8; 1]);
    drop(f);

    let log = env.home().join("logs").join(format!("default-{name}.log"));
    let before = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
    for _ in 0..20 {
        let r = get(port, "/", &[]).unwrap();
        assert_eq!(r.status, 200, "answered with a full disk: {}", r.body);
    }
    // tmpfs still fills the last page a file has.
    assert!(std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0) <= before + 4096, "the log could not grow");

    // A copy dies on the full disk: the spare stands in at once, and the
    // copy is started again and becomes ready.
    let visitors = Loop::start(port);
    let r_pid = env.pid_of(&name, 1);
    signal(r_pid, 9);
    wait_until(Duration::from_secs(60), "copy 1 to come back", || {
        env.copies(&name).iter().any(|c| c.copy == 1 && c.ready && c.pid.is_some_and(|p| p != r_pid)).then_some(())
    });
    let (sent, failed) = visitors.finish();
    assert!(sent > 10 && failed.is_empty(), "{} of {sent} requests failed: {failed:?}", failed.len());
    assert!(env.ok(&["status", &name]).contains(&name), "status answers");
    std::fs::remove_file(&filler).unwrap();
}
