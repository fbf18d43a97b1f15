//! README, "Staying up", with real R: crashes and backoff, restart-policy,
//! redeploys that drain, a broken version, --now, settings that restart
//! nothing, scaling in order. A request loop runs through the timelines and
//! counts what fails.

use std::time::Duration;

use crate::helpers::*;

const START: Duration = Duration::from_secs(60);

/// The settle (the 10 s a draining copy is kept even with no
/// sessions), and some: past it, only sessions keep a copy.
const SETTLE_AND_SOME: u64 = 12_000;

/// When the copy began to drain (unix ms), from state.json.
fn drain_started(env: &Env, app: &str, copy: u32) -> u64 {
    wait_until(Duration::from_secs(10), "the drain start in state.json", || env.record(app, copy)?["drain_started_ms"].as_u64())
}

#[test]
fn a_crashing_copy_backs_off_two_four_eight_seconds_and_shows_crash_looping() {
    let env = Env::new("backoff");
    let port = free_port();
    let manifest = env.app("crashy", port, "warm-replicas: 0\n");
    std::fs::write(manifest.parent().unwrap().join("app.R"), "quit(status = 3L)\n").unwrap();
    env.apply(&manifest);

    // The backoff is from an exit to the next start, both in state.json in
    // ms: R's own start-up time is not in it, however slow the machine.
    // Each start's pair shows until that copy exits again (R's whole run),
    // with the crash count it follows: a pair the sampling misses leaves a
    // gap, never a wait compared with another crash's backoff.
    let mut waits = std::collections::BTreeMap::new();
    wait_until(Duration::from_secs(90), "three restarts of copy 1", || {
        let rec = env.record("crashy", 1)?;
        let (started, exited, crashes) = (rec["started_ms"].as_u64()?, rec["last_exit"]["at_ms"].as_u64()?, rec["crashes"].as_u64()?);
        if started > exited {
            waits.insert(crashes, started - exited);
        }
        (waits.len() >= 3).then_some(())
    });
    // README, "Staying up": the backoff is 2 s, doubling. Never less; more
    // only by the daemon's own delay in acting on its timer (1.5 s, scaled
    // by SHINYCTL_TEST_SLOW on a loaded machine).
    let late = slow(Duration::from_millis(1500)).as_millis() as u64;
    for (&crashes, &waited) in &waits {
        // The docs' figures, not the code's: 2 s, doubling, 60 s at most.
        let backoff = (2000u64 << (crashes.max(1) - 1).min(5)).min(60_000);
        assert!(waited >= backoff && waited < backoff + late, "after crash {crashes} it waited {waited} ms, not {backoff}: {waits:?}");
    }
    assert!(env.starts("default-crashy.log").len() >= 4, "the log shows each start");
    let c = &env.copies("crashy")[0];
    assert_eq!(c.status, "crash-looping");
    assert!(c.crashes >= 3, "crashes counted: {c:?}");
    let text = env.status_text(Some("crashy"));
    assert!(text.contains("crashy: copy 1 is crash-looping: it exited with status 3"), "{text}");
    assert!(text.contains("default-crashy.log"), "says where to look: {text}");
}

#[test]
fn restart_policy_decides_whether_an_exited_copy_comes_back() {
    let env = Env::new("policy");
    // (policy, exit status, comes back)
    let cases = [("never", 1, false), ("on-failure", 0, false), ("on-failure", 1, true), ("always", 0, true)];
    for (i, (policy, code, back)) in cases.iter().enumerate() {
        let name = format!("p{i}");
        let manifest = env.app(&name, free_port(), &format!("warm-replicas: 0\nrestart-policy: {policy}\n"));
        std::fs::write(manifest.parent().unwrap().join("app.R"), format!("quit(status = {code}L)\n")).unwrap();
        env.apply(&manifest);
        let log = format!("default-{name}.log");
        if *back {
            wait_until(Duration::from_secs(20), "a restart", || (env.starts(&log).len() >= 2).then_some(()));
        } else {
            let c = wait_until(Duration::from_secs(20), "the copy to be left down", || {
                env.copies(&name).into_iter().find(|c| c.status == "exited")
            });
            assert!(c.pid.is_none());
            let text = env.status_text(Some(&name));
            assert!(
                text.contains(&format!("{name}: copy 1 is left down: it exited with status {code} and restart-policy is {policy}")),
                "a line says why: {text}"
            );
            // Past the 2 s backoff and a 5 s cycle, it is still left down.
            holds_for(Duration::from_secs(8), &format!("{policy} after status {code}: not restarted"), || {
                env.starts(&log).len() == 1 && env.copies(&name).iter().all(|c| c.status == "exited" && c.pid.is_none())
            });
        }
    }
}

#[test]
fn a_redeploy_drains_the_old_copy_while_its_session_stays_open() {
    let env = Env::new("redeploy");
    let port = free_port();
    let manifest = env.app("rd", port, "drain-timeout: 60s\n");
    env.apply(&manifest);
    env.wait_roles("rd", "1:active 2:warm", START);
    wait_http_ok(port, Duration::from_secs(10));
    let old = env.pid_of("rd", 1);
    let old_spare = env.pid_of("rd", 2);
    let first = get(port, "/", &[]).unwrap();
    assert_eq!(first.copy(), Some(1));
    let cookie = first.cookie().unwrap();
    let mut session = Session::open(port, &cookie);
    assert_eq!(session.copy, 1);

    let requests = Loop::start(port);
    let out = env.ok(&["restart", "rd"]);
    assert!(out.contains("restarting"), "returns at once: {out}");
    env.wait_roles("rd", "3:active 4:warm 1:draining", START);
    wait_gone(old_spare, Duration::from_secs(10), "the old spare to stop right away");
    assert!(pid_alive(old), "the old copy keeps its visitor");
    session.still_on_its_copy(1);
    assert_eq!(get(port, "/", &[]).unwrap().copy(), Some(3), "new visitors go to the new copy");
    // The open page's own requests stay on the old copy; reloading the page brings the new one.
    assert_eq!(get(port, "/", &[("Cookie", &cookie)]).unwrap().copy(), Some(1), "an old page keeps its copy");
    let reload = get(port, "/", &[("Cookie", &cookie), ("Sec-Fetch-Mode", "navigate"), ("Sec-Fetch-Dest", "document")]).unwrap();
    assert_eq!(reload.copy(), Some(3), "reloading brings the new version");
    assert!(reload.cookie().is_some_and(|c| c != cookie), "with a cookie for the new copy");
    let text = env.status_text(Some("rd"));
    assert!(text.contains("rd: copy 1 is draining with 1 session; it stops when they end, or in "), "{text}");
    assert!(text.contains("(1 warm, 1 draining)"), "{text}");

    // Past the 10 s settle, the open session still keeps it.
    wait_clock(drain_started(&env, "rd", 1) + SETTLE_AND_SOME);
    assert!(pid_alive(old), "the session keeps the old copy past the settle");
    session.still_on_its_copy(2);
    assert!(env.status_text(Some("rd")).contains("rd: copy 1 is draining with 1 session"));

    // The session ends: the old copy stops within about 15 s (the settle).
    session.close();
    wait_gone(old, Duration::from_secs(30), "the drained copy to stop");
    env.wait_roles("rd", "3:active 4:warm", Duration::from_secs(5));
    let (sent, errors) = requests.finish();
    assert!(errors.is_empty(), "no request lost during the redeploy: {} of {sent}: {errors:?}", errors.len());
}

/// A daemon that starts during a drain (an upgrade; `shutdown` then
/// `serve -d`) keeps the draining copy's sessions: its first cycle runs
/// before it has probed the adopted copy or read the load balancer's
/// figures, and used to take the copy for not ready and idle, and stop it.
#[test]
fn a_daemon_started_during_a_drain_keeps_the_draining_copy_s_sessions() {
    let env = Env::new("drainadopt");
    let port = free_port();
    env.apply(&env.app("da", port, "warm-replicas: 0\ndrain-timeout: 60s\n"));
    env.wait_roles("da", "1:active", START);
    let old = env.pid_of("da", 1);
    let mut session = Session::open(port, "");
    env.ok(&["restart", "da"]);
    env.wait_roles("da", "2:active 1:draining", START);
    let daemon = env.status()["daemon_pid"].as_u64().unwrap() as u32;
    env.ok(&["shutdown"]);
    wait_gone(daemon, Duration::from_secs(10), "the daemon to end");
    env.ok(&["serve", "-d"]);
    env.wait_roles("da", "2:active 1:draining", START);
    holds_for(Duration::from_secs(3), "the new daemon keeps the draining copy while its session is open", || pid_alive(old));
    session.still_on_its_copy(1);
    let text = env.status_text(Some("da"));
    assert!(text.contains("da: copy 1 is draining with 1 session"), "{text}");
    session.close();
    wait_gone(old, Duration::from_secs(30), "the drained copy to stop once its session ended");
}

#[test]
fn a_draining_copy_stops_at_drain_timeout_and_now_does_not_wait() {
    let env = Env::new("timeout");
    let port = free_port();
    // Longer than the settle, so only the timeout can end the drain.
    let manifest = env.app("dt", port, "warm-replicas: 0\ndrain-timeout: 15s\n");
    env.apply(&manifest);
    env.wait_roles("dt", "1:active", START);
    let old = env.pid_of("dt", 1);
    let session = Session::open(port, "");
    env.ok(&["restart", "dt"]);
    env.wait_roles("dt", "2:active 1:draining", START);
    let text = env.status_text(Some("dt"));
    assert!(text.contains("dt: copy 1 is draining with 1 session"), "{text}");
    let timeout_at = drain_started(&env, "dt", 1) + 15_000;
    wait_gone(old, Duration::from_millis(timeout_at.saturating_sub(now_ms()) + 10_000), "the drain-timeout to stop copy 1");
    assert!(now_ms() >= timeout_at, "not before drain-timeout: {} ms early", timeout_at.saturating_sub(now_ms()));
    drop(session);

    // --now: the old copy stops as soon as the new one is ready, sessions or not.
    let old = env.pid_of("dt", 2);
    let session = Session::open(port, "");
    assert_eq!(session.copy, 2);
    std::fs::write(&manifest, format!("app-name: dt\nport: {port}\nwarm-replicas: 0\ndrain-timeout: 15m\n")).unwrap();
    env.apply(&manifest);
    env.ok(&["restart", "dt", "--now"]);
    env.wait_roles("dt", "3:active", START);
    wait_gone(old, Duration::from_secs(15), "--now to stop copy 2");
    drop(session);
}

#[test]
fn a_broken_version_never_takes_over() {
    let env = Env::new("broken");
    let port = free_port();
    let manifest = env.app("br", port, "");
    env.apply(&manifest);
    env.wait_roles("br", "1:active 2:warm", START);
    wait_http_ok(port, Duration::from_secs(10));

    // A new version that fails at start (the test app stops when BROKEN=yes).
    // Shiny re-reads a changed app.R even in running copies, so the broken
    // version is made with the environment, which only new copies get.
    let requests = Loop::start(port);
    std::fs::write(&manifest, format!("app-name: br\nport: {port}\nenv:\n  BROKEN: \"yes\"\n")).unwrap();
    env.apply(&manifest);
    let text = wait_until(Duration::from_secs(30), "status to say copy 3 doesn't start", || {
        let t = env.status_text(Some("br"));
        t.contains("br: copy 3 doesn't start: it exited with status 1").then_some(t)
    });
    assert!(text.contains("the old copies keep serving") && text.contains("default-br@3.log"), "{text}");
    assert_eq!(env.roles("br"), "1:active 2:warm", "the old ones keep serving");
    assert_eq!(get(port, "/", &[]).unwrap().copy(), Some(1));
    let log = std::fs::read_to_string(env.home().join("logs/default-br@3.log")).unwrap();
    assert!(log.contains("this version is broken"), "its log says why: {log}");

    // Fixed, and restarted during the broken redeploy (restart reads the
    // manifest as it is now): straight to the newest.
    std::fs::write(&manifest, format!("app-name: br\nport: {port}\n")).unwrap();
    env.ok(&["restart", "br"]);
    env.wait_roles("br", "4:active 5:warm", START);
    // (The old copies 1 and 2 may still be on their way out.)
    assert!(!env.copies("br").iter().any(|c| c.copy == 3), "copy 3 is gone: {:?}", env.copies("br"));
    let (sent, errors) = requests.finish();
    assert!(errors.is_empty(), "no request lost: {} of {sent}: {errors:?}", errors.len());
}

#[test]
fn settings_changes_restart_only_what_they_must() {
    let env = Env::new("settings");
    let port = free_port();
    let manifest = env.app("st", port, "warm-replicas: 0\n");
    env.apply(&manifest);
    env.wait_roles("st", "1:active", START);
    let pid = env.pid_of("st", 1);

    // Port, lb-policy, drain-timeout and restart-policy: no R process restarts.
    let new_port = free_port();
    std::fs::write(
        &manifest,
        format!("app-name: st\nport: {new_port}\nwarm-replicas: 0\nlb-policy: first\ndrain-timeout: 1m\nrestart-policy: on-failure\n"),
    )
    .unwrap();
    let out = env.apply(&manifest);
    assert!(out.contains("without restarting"), "{out}");
    wait_http_ok(new_port, Duration::from_secs(20));
    wait_until(Duration::from_secs(20), "the old port to close", || get(port, "/", &[]).is_err().then_some(()));
    assert_eq!(env.pid_of("st", 1), pid, "same process");

    // env changes how the app starts: a redeploy, and the new copy sees it.
    std::fs::write(&manifest, format!("app-name: st\nport: {new_port}\nwarm-replicas: 0\nenv:\n  GREETING: hej\n")).unwrap();
    let out = env.apply(&manifest);
    assert!(out.contains("changed how it starts"), "{out}");
    env.wait_roles("st", "2:active", START);
    let r = get(new_port, "/", &[]).unwrap();
    assert_eq!(between(&r.body, "greeting=", ";"), Some("hej"));
    wait_gone(pid, Duration::from_secs(20), "the old copy to stop");
}

#[test]
fn scaling_down_keeps_the_copy_with_sessions() {
    let env = Env::new("scaledown");
    let port = free_port();
    let manifest = env.app("sd", port, "replicas: 3\nwarm-replicas: 0\nlb-policy: round-robin\n");
    env.apply(&manifest);
    env.wait_roles("sd", "1:active 2:active 3:active", START);
    // A session on copy 2.
    let mut session = wait_until(Duration::from_secs(30), "a session placed on copy 2", || {
        let s = Session::open(port, "");
        if s.copy == 2 {
            return Some(s);
        }
        s.close();
        None
    });
    std::fs::write(&manifest, format!("app-name: sd\nport: {port}\nreplicas: 1\nwarm-replicas: 0\n")).unwrap();
    env.apply(&manifest);
    // Copies 1 and 3 have no sessions: they go first, and stop after the settle.
    env.wait_roles("sd", "2:active", Duration::from_secs(30));
    // Their records go once their processes have exited.
    let left = wait_until(Duration::from_secs(30), "copies 1 and 3 to be gone", || {
        let copies = env.copies("sd");
        (copies.len() == 1).then_some(copies)
    });
    assert_eq!(left[0].copy, 2, "the copy with the session stays");
    session.still_on_its_copy(1);
    session.close();
}

#[test]
fn while_the_daemon_is_down_the_spare_still_stands_in_and_the_dead_copy_waits_for_it() {
    let env = Env::new("daemondown");
    let downd = &unique("downd");
    let log = &format!("default-{downd}.log");
    let port = env.started(downd, "", "1:active 2:warm");
    let daemon = env.status()["daemon_pid"].as_u64().unwrap() as u32;
    let first = env.pid_of(downd, 1);
    signal(daemon, 15);
    wait_gone(daemon, Duration::from_secs(10), "the daemon to exit");

    let requests = Loop::start(port);
    signal(first, 9);
    wait_gone(first, Duration::from_secs(10), "copy 1 to be killed");
    let r = get(port, "/", &[]).unwrap();
    assert_eq!(r.copy(), Some(2), "the load balancer put the spare in on its own");
    assert_eq!(env.starts(log).len(), 1, "nothing started copy 1 again while the daemon was down");

    env.ok(&["serve", "-d"]);
    env.wait_roles(downd, "2:active 1:warm", START);
    assert_ne!(env.pid_of(downd, 1), first, "the new daemon restarted the dead copy");
    assert_eq!(env.starts(log).len(), 2, "once");
    let (sent, errors) = requests.finish();
    assert!(errors.is_empty(), "no request lost: {} of {sent}: {errors:?}", errors.len());
}

#[test]
fn a_copy_whose_port_another_program_took_moves_to_another_port() {
    let env = Env::new("portmove");
    let port = env.started("pm", "warm-replicas: 0\n", "1:active");
    let before = env.copies("pm")[0].clone();
    signal(before.pid.unwrap(), 9);
    // Another program takes the copy's port while it waits out its backoff.
    let squatter = wait_until(Duration::from_secs(20), "the port to be free to take", || {
        std::net::TcpListener::bind(("127.0.0.1", before.copy_port)).ok()
    });
    env.wait_roles("pm", "1:active", START);
    let after = env.copies("pm")[0].clone();
    assert_ne!(after.copy_port, before.copy_port, "the copy moved to another port");
    assert_eq!(get(port, "/", &[]).unwrap().copy(), Some(1));
    drop(squatter);
}

#[test]
fn a_copys_own_disk_outlives_its_process_but_not_a_redeploy() {
    let env = Env::new("scratch");
    let sc = &unique("sc");
    let port = env.started(sc, "warm-replicas: 0\n", "1:active");
    let scratch = |r: &Response| between(&r.body, "scratch=", ";").map(str::to_string);
    assert_eq!(scratch(&wait_http_ok(port, Duration::from_secs(10))).as_deref(), Some("empty"));
    let dir = env.home().join(format!("scratch/default-{sc}/1"));
    assert!(dir.join("marker").exists(), "SHINYCTL_SCRATCH is the copy's folder under the home");

    // The same copy, restarted after a crash, finds what it wrote.
    let pid = env.pid_of(sc, 1);
    signal(pid, 9);
    wait_gone(pid, Duration::from_secs(10), "copy 1 to be killed");
    env.wait_roles(sc, "1:active", START);
    assert_ne!(env.pid_of(sc, 1), pid, "copy 1 was started again");
    assert_eq!(scratch(&get(port, "/", &[]).unwrap()).as_deref(), Some("kept"));

    // A redeploy starts from an empty disk, and the old copy's goes with it.
    env.ok(&["restart", sc, "--now"]);
    env.wait_roles(sc, "2:active", START);
    assert_eq!(scratch(&get(port, "/", &[]).unwrap()).as_deref(), Some("empty"));
    wait_until(Duration::from_secs(15), "copy 1's disk to be removed", || (!dir.exists()).then_some(()));
}

#[test]
fn changing_host_moves_the_listener_without_restarting_a_copy() {
    let env = Env::new("host");
    let port = free_port();
    let manifest = env.app("hs", port, "warm-replicas: 0\nhost: 127.0.0.1\n");
    env.apply(&manifest);
    env.wait_roles("hs", "1:active", START);
    wait_http_ok(port, Duration::from_secs(10));
    let pid = env.pid_of("hs", 1);
    let answers = |ip: &str| std::net::TcpStream::connect((ip, port)).is_ok();
    assert!(answers("127.0.0.1") && !answers("127.0.0.2"), "listens on the manifest's host only");

    std::fs::write(&manifest, format!("app-name: hs\nport: {port}\nwarm-replicas: 0\nhost: 127.0.0.2\n")).unwrap();
    let out = env.apply(&manifest);
    assert!(out.contains("without restarting"), "{out}");
    wait_until(Duration::from_secs(20), "the listener to move", || (answers("127.0.0.2") && !answers("127.0.0.1")).then_some(()));
    assert_eq!(env.pid_of("hs", 1), pid, "same process");
}

#[test]
fn the_crash_count_goes_back_to_a_dash_after_a_minute_up() {
    let env = Env::new("crashreset");
    env.started("cr", "warm-replicas: 0\n", "1:active");
    let pid = env.pid_of("cr", 1);
    signal(pid, 9);
    wait_until(Duration::from_secs(30), "the crash to be counted", || env.copies("cr").iter().any(|c| c.crashes == 1).then_some(()));
    env.wait_roles("cr", "1:active", START);
    let row =
        |env: &Env| -> Vec<String> { env.ok(&["status", "cr"]).lines().nth(1).unwrap().split_whitespace().map(str::to_string).collect() };
    assert_eq!(row(&env)[9], "1", "CRASHES while it has not stayed up a minute");
    // "Up" counts from the copy's start, not from when it was ready.
    let rec = env.record("cr", 1).expect("copy 1 in state.json");
    assert_ne!(rec["pid"].as_u64(), Some(pid as u64), "the record is of the new process");
    let started = rec["started_ms"].as_u64().expect("its start time");
    wait_until(Duration::from_secs(120), "CRASHES back to -", || (row(&env)[9] == "-").then_some(()));
    let up = now_ms() - started;
    assert!(up >= 60_000, "not before a minute up: {up} ms");
    assert!(up < 60_000 + 15_000, "soon after a minute up: {up} ms");
}

#[test]
fn a_copy_that_ignores_sigterm_is_killed_ten_seconds_later() {
    let env = Env::new("grace");
    // R that ignores SIGTERM: an ignored signal stays ignored across exec.
    let stubborn = env.script("stubborn-R", "trap '' TERM\nexec R \"$@\"\n");
    env.started("stub", &format!("warm-replicas: 0\nr-path: {}\n", stubborn.display()), "1:active");
    let pid = env.pid_of("stub", 1);

    // README, "Status": a copy being stopped gets SIGTERM to its
    // processes, then SIGKILL after 10 s.
    let asked = std::time::Instant::now();
    env.ok(&["delete", "stub", "--now"]);
    holds_for(Duration::from_secs(9).saturating_sub(asked.elapsed()), "the copy lives through the grace", || pid_alive(pid));
    wait_gone(pid, Duration::from_secs(30), "SIGKILL soon after the grace");
    let took = asked.elapsed();
    assert!(took >= Duration::from_secs(10), "not before 10 s: {took:?}");
}

/// A stop never cuts an answer that has begun: a download from the old
/// copy is under way (its visitor reads slowly) when drain-timeout ends
/// the drain; the copy leaves the table, and stops only once the download
/// is whole.
#[test]
fn a_stop_waits_for_an_answer_that_has_begun() {
    use std::io::{Read, Write};
    const SIZE: usize = 48 << 20;
    let env = Env::new("answer");
    let port = free_port();
    let manifest = env.app("ans", port, "warm-replicas: 0\ndrain-timeout: 2s\n");
    let www = manifest.parent().unwrap().join("www");
    std::fs::create_dir_all(&www).unwrap();
    // Far more than the sockets between R and the visitor hold: R is
    // still writing it while the visitor does not read.
    std::fs::write(www.join("big.bin"), vec![b'x'; SIZE]).unwrap();
    env.apply(&manifest);
    env.wait_roles("ans", "1:active", START);
    let old = env.pid_of("ans", 1);

    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(s, "GET /big.bin HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n").unwrap();
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "the download's head comes");
        got.extend_from_slice(&buf[..n]);
    }
    let head_end = got.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let head = String::from_utf8_lossy(&got[..head_end]).to_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains(&format!("content-length: {SIZE}")), "{head}");

    env.ok(&["restart", "ans"]);
    env.wait_roles("ans", "2:active 1:draining", START);
    wait_until(Duration::from_secs(30), "drain-timeout to tell copy 1 to stop", || env.record("ans", 1)?["stop_started_ms"].as_u64());
    holds_for(Duration::from_secs(3), "copy 1 runs while its answer is under way", || pid_alive(old));
    let mut body = got.len() - head_end;
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => body += n,
            Err(e) => panic!("the download was cut after {body} of {SIZE} bytes: {e}"),
        }
    }
    assert_eq!(body, SIZE, "the download is whole");
    wait_gone(old, Duration::from_secs(15), "copy 1 to stop once its answer is given");
}
