//! Upgrading shinyctl: a new daemon of another build adopts the copies and
//! replaces the load balancer of the old build without losing a request.

use std::time::Duration;

use crate::helpers::*;

#[test]
fn a_new_build_adopts_the_copies_and_replaces_the_load_balancer_losing_no_request() {
    let env = Env::new("upgrade");
    let old = another_build(&env.dir);
    let port = free_port();
    let manifest = env.app("up", port, "");
    let out = env.run_binary(&old, &["apply", "-f", manifest.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    env.wait_roles("up", "1:active 2:warm", Duration::from_secs(60));
    wait_http_ok(port, Duration::from_secs(10));
    let status = env.status();
    let (old_daemon, old_proxy) = (status["daemon_pid"].as_u64().unwrap() as u32, status["proxy_pid"].as_u64().unwrap() as u32);
    assert!(cmdline(old_proxy).contains("old-build"), "the load balancer is the old build's");
    let copies: Vec<u32> = env.copies("up").iter().filter_map(|c| c.pid).collect();

    let requests = Loop::start(port);
    wait_until(Duration::from_secs(30), "requests flowing", || (requests.sent() > 20).then_some(()));
    signal(old_daemon, 15);
    wait_gone(old_daemon, Duration::from_secs(10), "the old daemon to exit");
    // `status` asked over and over from the new daemon's first moments
    // must not keep the old build's load balancer from being replaced.
    let asking = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let hammer = {
        let (asking, home) = (asking.clone(), env.home());
        std::thread::spawn(move || {
            while asking.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = std::process::Command::new(bin()).args(["status", "--json"]).env("SHINYCTL_HOME", &home).output();
            }
        })
    };
    env.ok(&["serve", "-d"]);
    wait_until(Duration::from_secs(30), "the old load balancer to be replaced and gone", || {
        let p = env.status()["proxy_pid"].as_u64()? as u32;
        (p != old_proxy && !pid_alive(old_proxy)).then_some(())
    });
    asking.store(false, std::sync::atomic::Ordering::Relaxed);
    hammer.join().unwrap();
    // Some requests through the new load balancer alone.
    let replaced = requests.sent();
    wait_until(Duration::from_secs(30), "requests after the switch", || (requests.sent() > replaced + 20).then_some(()));
    let (sent, errors) = requests.finish();
    assert!(errors.is_empty(), "no request lost in the upgrade: {} of {sent}: {errors:?}", errors.len());

    let new_proxy = env.status()["proxy_pid"].as_u64().unwrap() as u32;
    assert!(!cmdline(new_proxy).contains("old-build"), "the new load balancer is the new build's");
    let api_log = std::fs::read_to_string(env.home().join("api.log")).unwrap();
    assert!(
        api_log.contains("took back 1 listening sockets from the running load balancer"),
        "the new daemon holds the sockets the old build's load balancer listened on: {api_log}"
    );
    let lock = std::fs::read_to_string(env.home().join("proxy/lock")).unwrap();
    assert_eq!(lock.trim(), new_proxy.to_string(), "the new one holds proxy/lock");
    let after: Vec<u32> = env.copies("up").iter().filter_map(|c| c.pid).collect();
    assert_eq!(after, copies, "the copies were adopted: same processes");
    assert_eq!(get(port, "/", &[]).unwrap().status, 200);
}

#[test]
fn the_documented_restart_line_pkill_then_serve_d_leaves_a_daemon_running() {
    let env = Env::new("pkillrace");
    env.started("pk", "warm-replicas: 0\n", "1:active");
    let old = env.status()["daemon_pid"].as_u64().unwrap() as u32;
    let copy = env.pid_of("pk", 1);
    // `pkill … && shinyctl serve -d`: the signal, then at once the new daemon.
    signal(old, 15);
    env.ok(&["serve", "-d"]);
    let new = env.status()["daemon_pid"].as_u64().unwrap() as u32;
    assert_ne!(new, old, "a new daemon answers");
    wait_gone(old, Duration::from_secs(20), "the old daemon to be gone");
    env.wait_roles("pk", "1:active", Duration::from_secs(30));
    assert_eq!(env.pid_of("pk", 1), copy, "the copy was adopted");
}

/// A daemon started while copies run (a restart, an upgrade of the same
/// build) takes the copies that were ready, and still listen on their own
/// ports, as ready at once: the load balancer never gets a table without
/// them (it used to, until the new daemon had probed each, holding every
/// visitor's request meanwhile).
#[test]
fn a_restarted_daemon_never_pushes_a_table_without_the_copies_it_adopted() {
    let env = Env::new("adoptready");
    env.started("ar", "warm-replicas: 1\n", "1:active 2:warm");
    let log = env.home().join("api.log");
    let tables =
        || std::fs::read_to_string(&log).unwrap().lines().filter(|l| l.contains("new table: ")).map(str::to_string).collect::<Vec<_>>();
    let before = tables().len();
    let copies = (env.pid_of("ar", 1), env.pid_of("ar", 2));
    env.ok(&["shutdown"]);
    env.ok(&["serve", "-d"]);
    env.wait_roles("ar", "1:active 2:warm", Duration::from_secs(10));
    holds_for(Duration::from_secs(3), "every table the new daemon pushes names both copies", || {
        tables()[before..].iter().all(|l| l.contains("1=active@") && l.contains("2=warm@"))
    });
    assert_eq!((env.pid_of("ar", 1), env.pid_of("ar", 2)), copies, "adopted, not started again");
}

/// A daemon that dies between starting the new build's load balancer and
/// stopping the old one (SIGKILL, a crash) leaves the old one running,
/// still serving the same sockets with an old table; the next daemon finds
/// it by `proxy/lock` and stops it.
#[test]
fn a_load_balancer_left_by_a_daemon_killed_mid_upgrade_is_stopped_by_the_next() {
    let env = Env::new("midupgrade");
    let old = another_build(&env.dir);
    let port = free_port();
    let manifest = env.app("mu", port, "warm-replicas: 0\n");
    let out = env.run_binary(&old, &["apply", "-f", manifest.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    env.wait_roles("mu", "1:active", Duration::from_secs(60));
    let status = env.status();
    let (old_daemon, old_proxy) = (status["daemon_pid"].as_u64().unwrap() as u32, status["proxy_pid"].as_u64().unwrap() as u32);
    signal(old_daemon, 15);
    wait_gone(old_daemon, Duration::from_secs(10), "the old daemon to exit");

    // The new build's daemon is killed the moment its load balancer appears.
    let home = env.home();
    let killer = std::thread::spawn(move || {
        let theirs = |what: &str| {
            pids_with_home(&home)
                .into_iter()
                .filter(|&p| cmdline(p).ends_with(what) && !cmdline(p).contains("old-build"))
                .collect::<Vec<_>>()
        };
        wait_until(Duration::from_secs(30), "the new build's load balancer to start", || {
            let new_proxy = *theirs(" proxy").first()?;
            let daemons = theirs(" serve");
            for &d in &daemons {
                signal(d, 9);
            }
            (!daemons.is_empty()).then_some((new_proxy, daemons))
        })
    });
    let _ = env.run(&["serve", "-d"]);
    let (new_proxy, killed) = killer.join().unwrap();
    env.track(new_proxy);
    for d in killed {
        wait_gone(d, Duration::from_secs(10), "the killed daemon");
    }
    assert!(pid_alive(old_proxy), "the test's premise: the daemon died before it stopped the old load balancer");

    env.ok(&["serve", "-d"]);
    wait_gone(old_proxy, Duration::from_secs(20), "the next daemon to stop the load balancer the killed one left");
    assert_eq!(env.status()["proxy_pid"].as_u64(), Some(new_proxy as u64), "the new build's load balancer serves on");
    wait_until(Duration::from_secs(20), "the app to answer through it", || get(port, "/", &[]).ok().filter(|r| r.status == 200));
}

/// The test app, plus `/hold`: answers `copy=N;` once the test puts the
/// file `go` on the copy's own disk (R answers nothing else meanwhile).
fn hold_app_r() -> String {
    let hold = r#"
library(shiny)
shiny:::handlerManager$addHandler(function(req) {
  if (!identical(req$PATH_INFO, "/hold")) return(NULL)
  scratch <- Sys.getenv("SHINYCTL_SCRATCH")
  writeLines("begun", file.path(scratch, "hold-begun"))
  while (!file.exists(file.path(scratch, "go"))) Sys.sleep(0.05)
  httpResponse(200, "text/plain", paste0("copy=", Sys.getenv("SHINYCTL_COPY"), ";"))
}, "hold-test")
"#;
    format!("{hold}{APP_R}")
}

/// The old build's load balancer, told to stop by the upgrade, answers the
/// requests it is in the middle of, and the sessions open through it go on
/// through the new one; no request of a client running throughout is lost.
#[test]
fn an_upgrade_answers_the_requests_under_way_and_keeps_the_sessions() {
    let env = Env::new("upgrade-held");
    // The release before this one: its daemon, load balancer and launcher.
    let old = previous_build();
    let port = free_port();
    let manifest = env.app_running(&hold_app_r(), "uh", port, "");
    let out = env.run_binary(&old, &["apply", "-f", manifest.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    env.wait_roles("uh", "1:active 2:warm", Duration::from_secs(60));
    wait_http_ok(port, Duration::from_secs(10));
    let status = env.status();
    let (old_daemon, old_proxy) = (status["daemon_pid"].as_u64().unwrap() as u32, status["proxy_pid"].as_u64().unwrap() as u32);
    let mut sessions: Vec<Session> = (0..2).map(|_| Session::open(port, "")).collect();
    let requests = Loop::start(port);
    wait_until(Duration::from_secs(30), "requests flowing", || (requests.sent() > 20).then_some(()));

    // Three requests in flight through the old load balancer: copy 1 holds them.
    let scratch = env.home().join("scratch/default-uh/1");
    let held: Vec<_> = (0..3).map(|_| std::thread::spawn(move || get(port, "/hold", &[]))).collect();
    wait_until(Duration::from_secs(10), "copy 1 to hold a request", || scratch.join("hold-begun").exists().then_some(()));
    signal(old_daemon, 15);
    wait_gone(old_daemon, Duration::from_secs(10), "the old daemon to exit");
    env.ok(&["serve", "-d"]);
    let log = env.home().join("api.log");
    wait_until(Duration::from_secs(30), "the old load balancer to be told to stop", || {
        std::fs::read_to_string(&log).ok().filter(|l| l.contains("stopping (SIGTERM)")).map(|_| ())
    });
    assert!(pid_alive(old_proxy), "the old load balancer is finishing its requests");
    std::fs::write(scratch.join("go"), "go").unwrap();
    for h in held {
        let r = h.join().unwrap().expect("an answer to a request in flight at the old load balancer's stop");
        assert_eq!((r.status, r.copy()), (200, Some(1)), "{r:?}");
    }
    wait_gone(old_proxy, Duration::from_secs(10), "the old load balancer to end once its requests are answered");
    let new_proxy = env.status()["proxy_pid"].as_u64().unwrap() as u32;
    assert!(new_proxy != old_proxy && !cmdline(new_proxy).contains("target/previous"), "this build's load balancer serves");
    let versions =
        |bin: &std::path::Path| String::from_utf8(std::process::Command::new(bin).arg("version").output().unwrap().stdout).unwrap();
    assert_ne!(versions(&old), versions(std::path::Path::new(bin())), "two builds");
    for (n, s) in sessions.iter_mut().enumerate() {
        s.still_on_its_copy(n as u64 + 1);
    }
    let (sent, errors) = requests.finish();
    assert!(errors.is_empty(), "no request lost in the upgrade: {} of {sent}: {errors:?}", errors.len());
}
