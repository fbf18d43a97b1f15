//! The foundation: apply, copies and roles, status, scaling, delete, bad
//! manifests, adoption by a new daemon, logs.

use std::time::Duration;

use crate::helpers::*;

const START: Duration = Duration::from_secs(60);

#[test]
fn apply_starts_an_active_copy_and_a_warm_spare_of_real_r() {
    let env = Env::new("apply");
    let port = free_port();
    let manifest = env.app("greet", port, "");
    let out = env.apply(&manifest);
    assert!(out.contains("greet: applied"), "{out}");

    env.wait_roles("greet", "1:active 2:warm", START);
    let copies = env.copies("greet");
    assert_eq!(copies.len(), 2);
    for c in &copies {
        let pid = c.pid.expect("a running copy has a PID");
        let cmd = cmdline(pid);
        // R, its run expression on its standard input (an -e costs R's
        // front script three seds), cold or claimed from the pool alike.
        assert!(is_copy_r(pid), "copy {} runs R: {cmd}", c.copy);
        assert!((20000..=29999).contains(&c.copy_port), "copy port {}", c.copy_port);
        assert_eq!(c.status, "alive");
    }

    // The table, as the README's "Status" shows it.
    let text = env.ok(&["status"]);
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "COPY", "ROLE", "PORT", "PID", "STATUS", "READY", "MEM", "SESSIONS", "CRASHES", "STARTED"]);
    let row: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(&row[..4], ["greet", "1", "active", &port.to_string()]);
    assert_eq!(row[5..7], ["alive", "ready"]);
    assert!(row[7].ends_with('M'), "MEM like 142M: {}", row[7]);
    assert_eq!(row[9], "-", "no crashes");
    assert!(row[10].len() == 25 && row[10].as_bytes()[10] == b'T', "STARTED like 2026-10-27T10:00:01+02:00: {}", row[10]);
    assert!(
        text.contains("Memory: ") && text.contains("in 2 R processes (1 warm), plus ") && text.contains("M for the load balancer."),
        "{text}"
    );

    // A visitor reaches the real Shiny app on the manifest's port.
    let page = wait_http_ok(port, Duration::from_secs(10));
    assert!(page.body.contains("shiny"), "a Shiny page: {}", &page.body[..page.body.len().min(300)]);
    assert_eq!(page.copy(), Some(1), "new visitors go to the active copy");

    // The files of the README's "Files".
    let home = env.home();
    for f in [
        "api.sock",
        "api.log",
        "registry.json",
        "logs/default-greet.log",
        "logs/default-greet@2.log",
        "proxy/cookie.key",
        "proxy/lock",
        "proxy/proxy.sock",
        "proxy/table.json",
        "proxy/settings.json",
    ] {
        assert!(home.join(f).exists(), "{f} exists");
    }
    assert!(manifest.parent().unwrap().join("state.json").exists(), "state.json beside the manifest");
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &str| std::fs::metadata(home.join(p)).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(""), 0o700);
    assert_eq!(mode("api.sock"), 0o600);
    assert_eq!(mode("proxy/cookie.key"), 0o600);
}

#[test]
fn changing_replicas_starts_and_stops_copies() {
    let env = Env::new("scale");
    let port = free_port();
    let manifest = env.app("scaled", port, "warm-replicas: 0\n");
    env.apply(&manifest);
    env.wait_roles("scaled", "1:active", START);

    std::fs::write(&manifest, format!("app-name: scaled\nport: {port}\nwarm-replicas: 0\nreplicas: 2\n")).unwrap();
    let out = env.apply(&manifest);
    assert!(out.contains("without restarting"), "{out}");
    env.wait_roles("scaled", "1:active 2:active", START);
    let first = env.pid_of("scaled", 1);

    // Scaling down drains the copy it removes (no sessions: it stops after the settle).
    std::fs::write(&manifest, format!("app-name: scaled\nport: {port}\nwarm-replicas: 0\nreplicas: 1\n")).unwrap();
    env.apply(&manifest);
    let removed = env.pid_of("scaled", 2);
    wait_gone(removed, Duration::from_secs(30), "copy 2 to stop");
    env.wait_roles("scaled", "1:active", Duration::from_secs(20));
    assert_eq!(env.pid_of("scaled", 1), first, "the copy that stays is not restarted");
}

#[test]
fn delete_stops_every_process_it_started() {
    let env = Env::new("delete");
    let port = free_port();
    let manifest = env.app("gone", port, "replicas: 2\n");
    env.apply(&manifest);
    env.wait_roles("gone", "1:active 2:active 3:warm", START);
    let pids: Vec<u32> = env.copies("gone").iter().filter_map(|c| c.pid).collect();
    assert_eq!(pids.len(), 3);

    let out = env.ok(&["delete", "gone", "--now"]);
    assert!(out.contains("deleted"), "{out}");
    wait_until(Duration::from_secs(20), "every copy to stop", || pids.iter().all(|&p| !pid_alive(p)).then_some(()));
    wait_until(Duration::from_secs(10), "the app to be forgotten", || env.status()["apps"].as_array().unwrap().is_empty().then_some(()));
    let registry = std::fs::read_to_string(env.home().join("registry.json")).unwrap();
    assert!(!registry.contains("\"gone\""), "{registry}");
    let err = env.run(&["restart", "gone"]);
    assert!(!err.status.success());
    assert!(String::from_utf8_lossy(&err.stderr).contains("no app named gone"));
}

#[test]
fn a_bad_manifest_is_refused_whole_and_nothing_running_changes() {
    let env = Env::new("bad");
    let port = free_port();
    let other_port = free_port();
    let good = env.app("good", port, "warm-replicas: 0\n");
    env.apply(&good);
    env.wait_roles("good", "1:active", START);
    let pid = env.pid_of("good", 1);
    let state_before = std::fs::read_to_string(good.parent().unwrap().join("state.json")).unwrap();

    // (manifest text, line, key, words that say what is allowed)
    let cases: Vec<(String, usize, &str, &str)> = vec![
        (format!("app-name: good\nport: {port}\nreplicaz: 2\n"), 3, "replicaz", "warm-replicas"),
        (format!("app-name: good\nport: {port}\nreplicas: two\n"), 3, "replicas", "whole number"),
        ("app-name: good\nport: 25000\n".to_string(), 2, "port", "20000"),
        (format!("app-name: good\nport: {port}\nreplicas: 0\n"), 3, "replicas", "at least 1"),
        (format!("app-name: good\nport: {port}\ndrain-timeout: soon\n"), 3, "drain-timeout", "15m"),
        (format!("app-name: good\nport: {port}\nentrypoint-file: nothere.R\n"), 3, "entrypoint-file", "nothere.R"),
        (format!("app-name: good\nport: {port}\nlb-policy: fastest\n"), 3, "lb-policy", "round-robin"),
        (format!("app-name: good\nport: {port}\nrequest-timeout: 1m\n"), 3, "request-timeout", "30s"),
    ];
    for (text, line, key, allowed) in cases {
        std::fs::write(&good, &text).unwrap();
        let out = env.run(&["apply", "-f", good.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "refused: {text}");
        let at = format!("{}:{line}", good.display());
        assert!(err.contains(&at) && err.contains(key) && err.contains(allowed), "error names {at}, {key}, {allowed}: {err}");
    }

    // A port another app uses is refused by the daemon, naming the line.
    let second = env.app("second", other_port, "");
    std::fs::write(&second, format!("app-name: second\n\nport: {port}\n")).unwrap();
    let out = env.run(&["apply", "-f", second.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains(&format!("{}:3", second.display())) && err.contains("port") && err.contains("app good"), "{err}");

    assert_eq!(env.pid_of("good", 1), pid, "the running copy is untouched");
    assert_eq!(env.roles("good"), "1:active");
    let state_after = std::fs::read_to_string(good.parent().unwrap().join("state.json")).unwrap();
    assert_eq!(state_before, state_after, "state.json is untouched");
    assert_eq!(env.status()["apps"].as_array().unwrap().len(), 1, "the refused app was not added");
}

#[test]
fn a_bad_manifest_starts_no_daemon() {
    let env = Env::new("nodaemon");
    let manifest = env.app("x", free_port(), "replicas: -1\n");
    let out = env.run(&["apply", "-f", manifest.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(!env.home().join("api.sock").exists(), "no daemon was started for a bad manifest");
}

#[test]
fn a_new_daemon_adopts_the_running_copies_and_load_balancer() {
    let env = Env::new("adopt");
    let port = free_port();
    let manifest = env.app("kept", port, "");
    env.apply(&manifest);
    env.wait_roles("kept", "1:active 2:warm", START);
    let status = env.status();
    let daemon = status["daemon_pid"].as_u64().unwrap() as u32;
    let proxy = status["proxy_pid"].as_u64().unwrap() as u32;
    let copies: Vec<u32> = env.copies("kept").iter().filter_map(|c| c.pid).collect();
    assert_eq!(cmdline(daemon).rsplit('/').next().unwrap(), "shinyctl serve", "the daemon's command line is `shinyctl serve`");

    // Stopping the daemon stops only the daemon.
    signal(daemon, 15);
    wait_gone(daemon, Duration::from_secs(10), "the daemon to exit");
    assert!(copies.iter().all(|&p| pid_alive(p)) && pid_alive(proxy), "copies and load balancer keep running");
    assert_eq!(get(port, "/", &[]).unwrap().status, 200, "the load balancer serves while the daemon is down");

    env.ok(&["serve", "-d"]);
    env.wait_roles("kept", "1:active 2:warm", Duration::from_secs(20));
    let after: Vec<u32> = env.copies("kept").iter().filter_map(|c| c.pid).collect();
    assert_eq!(after, copies, "same PIDs, adopted");
    assert_eq!(env.status()["proxy_pid"].as_u64().unwrap() as u32, proxy, "same load balancer");

    // An adopted copy's exit is still noticed at once (its exit is recorded
    // when noticed), not at the next 5 s cycle, and it comes back.
    let killed = now_ms();
    signal(copies[0], 9);
    let noticed = wait_until(Duration::from_secs(30), "the exit to be recorded", || {
        env.record("kept", 1)?["last_exit"]["at_ms"].as_u64().filter(|&at| at >= killed)
    });
    // At once: well before the next 5 s cycle (a loaded machine's delay
    // scaled by SHINYCTL_TEST_SLOW, never to the cycle itself).
    let at_once = slow(Duration::from_millis(1000)).min(Duration::from_millis(4000)).as_millis() as u64;
    assert!(noticed - killed < at_once, "noticed {} ms after the kill", noticed - killed);
    env.wait_roles("kept", "2:active 1:warm", START);
}

#[test]
fn logs_show_a_copys_output() {
    let env = Env::new("logs");
    let manifest = env.app("talky", free_port(), "warm-replicas: 0\n");
    env.apply(&manifest);
    env.wait_roles("talky", "1:active", START);
    let out = env.ok(&["logs", "talky"]);
    assert!(out.contains("Listening on http://127.0.0.1:"), "{out}");
    let out = env.run(&["logs", "talky", "--copy", "9"]);
    assert!(!out.status.success());
}

#[test]
fn version_and_status_without_a_daemon() {
    let env = Env::new("version");
    assert!(env.ok(&["version"]).starts_with("shinyctl "));
    let out = env.run(&["status"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("shinyctl serve -d"), "says what to do next");
}

#[test]
fn delete_closes_the_port_at_once_refuses_a_reapply_and_now_ends_the_copy() {
    let env = Env::new("deldrain");
    let port = free_port();
    let manifest = env.app("deldrain", port, "warm-replicas: 0\n");
    env.apply(&manifest);
    env.wait_roles("deldrain", "1:active", START);
    wait_http_ok(port, Duration::from_secs(10));
    let pid = env.pid_of("deldrain", 1);
    let session = Session::open(port, "");

    let out = env.ok(&["delete", "deldrain"]);
    assert!(out.contains("its 1 copy stops once its sessions end"), "{out}");
    wait_until(Duration::from_secs(20), "the port to stop listening", || get(port, "/", &[]).is_err().then_some(()));
    // That it keeps the copy for the session past the settle is
    // delete_keeps_a_copy_with_an_open_session_past_the_settle.
    let again = env.run(&["apply", "-f", manifest.to_str().unwrap()]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("is being deleted"), "{}", String::from_utf8_lossy(&again.stderr));

    env.ok(&["delete", "deldrain", "--now"]);
    wait_gone(pid, Duration::from_secs(15), "the copy to stop");
    wait_until(Duration::from_secs(10), "the app to be forgotten", || env.status()["apps"].as_array().unwrap().is_empty().then_some(()));
    env.apply(&manifest);
    env.wait_roles("deldrain", "1:active", START);
    session.close();
}

#[test]
fn a_daemon_told_to_stop_as_its_load_balancer_ends_starts_no_new_one() {
    let env = Env::new("stopboth");
    env.started("both", "warm-replicas: 0\n", "1:active");
    let load_balancers = || -> Vec<u32> { pids_with_home(&env.home()).into_iter().filter(|&p| cmdline(p).ends_with(" proxy")).collect() };
    // As a script's cleanup does: both signalled at once. A daemon that is
    // stopping would otherwise start a load balancer nobody ends. The race
    // is the daemon's to lose, so it is run a few times.
    for round in 0..3 {
        if round > 0 {
            env.ok(&["serve", "-d"]);
        }
        let status = wait_until(Duration::from_secs(30), "a daemon with a load balancer", || {
            let s = env.status();
            (s["proxy_pid"].as_u64().is_some_and(|p| pid_alive(p as u32))).then_some(s)
        });
        let (daemon, proxy) = (status["daemon_pid"].as_u64().unwrap() as u32, status["proxy_pid"].as_u64().unwrap() as u32);
        signal(daemon, 15);
        signal(proxy, 9);
        wait_gone(daemon, Duration::from_secs(20), "the daemon to exit");
        wait_gone(proxy, Duration::from_secs(10), "the load balancer to be killed");
        assert_eq!(load_balancers(), Vec::<u32>::new(), "round {round}: no load balancer started by the stopping daemon");
    }
}

#[test]
fn delete_keeps_a_copy_with_an_open_session_past_the_settle() {
    let env = Env::new("delkeep");
    let port = env.started("delkeep", "warm-replicas: 0\n", "1:active");
    let pid = env.pid_of("delkeep", 1);
    let mut session = Session::open(port, "");
    env.ok(&["delete", "delkeep"]);
    // Past the 10 s settle only the session keeps it.
    let drain =
        wait_until(Duration::from_secs(10), "the drain start in state.json", || env.record("delkeep", 1)?["drain_started_ms"].as_u64());
    wait_clock(drain + 12_000);
    assert!(pid_alive(pid), "the copy keeps its open session past the settle");
    session.still_on_its_copy(1);
    session.close();
    wait_gone(pid, Duration::from_secs(30), "the copy to stop once its session ended");
}

/// An app whose page takes half a second when asked for `/?slow`.
const SLOW_PAGE_R: &str = r#"
library(shiny)
ui <- function(req) {
  if (grepl("slow", req$QUERY_STRING)) {
    cat("a slow page begins\n")
    flush(stdout())
    Sys.sleep(0.5)
  }
  fluidPage(tags$p(paste0("copy=", Sys.getenv("SHINYCTL_COPY"), ";")))
}
shinyApp(ui, function(input, output, session) {})
"#;

/// `delete --now` does not wait for sessions, but a request already in
/// flight to a copy is answered before the copy is stopped (a second at
/// most): the port closes at once, and the copy stops once the load
/// balancer has nothing in flight to it.
#[test]
fn delete_now_lets_a_request_in_flight_be_answered() {
    let env = Env::new("delnow-inflight");
    let name = unique("delnow");
    let port = free_port();
    let manifest = env.app_running(SLOW_PAGE_R, &name, port, "warm-replicas: 0\n");
    env.apply(&manifest);
    env.wait_roles(&name, "1:active", START);
    wait_http_ok(port, Duration::from_secs(10));
    let pid = env.pid_of(&name, 1);

    let slow = std::thread::spawn(move || get(port, "/?slow", &[]));
    let log = env.home().join("logs").join(format!("default-{name}.log"));
    wait_until(Duration::from_secs(10), "R to be in the middle of the slow page", || {
        std::fs::read_to_string(&log).ok()?.contains("a slow page begins").then_some(())
    });
    let out = env.ok(&["delete", &name, "--now"]);
    assert!(out.contains("its 1 copy stops now"), "{out}");
    let answer = slow.join().unwrap().expect("an answer");
    assert_eq!((answer.status, answer.copy()), (200, Some(1)), "the request in flight was answered: {}", answer.body);
    wait_gone(pid, Duration::from_secs(15), "the copy to stop");
    assert!(get(port, "/", &[]).is_err(), "the port is closed");
}
