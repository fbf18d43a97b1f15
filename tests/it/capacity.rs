//! Capacity with real Shiny apps (README, "Capacity"): sessions past
//! `max-sessions` move new visitors to the spare at once and a new spare
//! starts; once they leave, the app shrinks back to `replicas`.

use std::time::{Duration, Instant};

use crate::helpers::*;

#[test]
fn sessions_past_max_sessions_go_to_the_stepped_in_spare_at_once_and_the_app_shrinks_back_when_they_leave() {
    let env = Env::new("capacity");
    let extra = "replicas: 1\nwarm-replicas: 1\nmax-replicas: 3\nmax-sessions: 2\nscale-at: 1\nscale-down-after: 5s\n";
    let port = env.started("grow", extra, "1:active 2:warm");

    // Copy 1 takes two sessions: then it is full.
    let first = [Session::open(port, ""), Session::open(port, "")];
    assert_eq!(first.iter().map(|s| s.copy).collect::<Vec<_>>(), vec![1, 1], "an active copy with room first");

    // The next visitor goes to the spare, which is up: no wait for R.
    let t = Instant::now();
    let third = Session::open(port, "");
    let took = t.elapsed();
    assert_eq!(third.copy, 2, "the visitor past max-sessions is on the spare");
    assert!(took < Duration::from_secs(3), "served by a copy that was up, not one starting: {took:?}");

    // The spare is active now, and a new spare starts behind it.
    env.wait_roles("grow", "1:active 2:active 3:warm", Duration::from_secs(60));
    let status = env.status();
    let app = status["apps"].as_array().unwrap().iter().find(|a| a["name"] == "grow").unwrap().clone();
    let capacity = &app["capacity"];
    assert_eq!((capacity["max_sessions"].as_u64(), capacity["max_replicas"].as_u64()), (Some(2), Some(3)), "{capacity}");
    assert_eq!(capacity["active_wanted"].as_u64(), Some(2), "{capacity}");
    let text = env.ok(&["status", "grow"]);
    assert!(text.contains("grow: 2 active of at most 3 (sessions 3 of 4); grew at "), "{text}");
    let log = std::fs::read_to_string(env.home().join("api.log")).unwrap();
    assert!(log.contains("grow grows from 1 to 2 active copies"), "the daemon's log says it grew and why:\n{log}");

    // A fourth visitor fills copy 2; it stays where it is, as do the others.
    let fourth = Session::open(port, "");
    assert_eq!(fourth.copy, 2, "the active copy with room");

    // They leave; after scale-down-after of low load the app is back at
    // replicas, one copy at a time, and the copy that drains goes.
    for s in first.into_iter().chain([third, fourth]) {
        s.close();
    }
    env.wait_roles("grow", "1:active 2:warm", Duration::from_secs(90));
    let capacity = env.status()["apps"][0]["capacity"].clone();
    assert_eq!(capacity["active_wanted"].as_u64(), Some(1), "{capacity}");
    let log = std::fs::read_to_string(env.home().join("api.log")).unwrap();
    assert!(log.contains("grow shrinks from 2 to 1 active copies"), "the daemon's log says it shrank and why:\n{log}");
    wait_until(Duration::from_secs(30), "the drained copy to be gone", || (env.copies("grow").len() == 2).then_some(()));
}

#[test]
fn at_max_replicas_with_every_copy_full_a_new_visitor_is_held_then_gets_the_busy_page() {
    let env = Env::new("capacity-top");
    let extra = "replicas: 1\nwarm-replicas: 1\nmax-replicas: 1\nmax-sessions: 1\nrequest-timeout: 3s\n";
    let port = free_port();
    env.apply(&env.app("top", port, extra));
    env.wait_roles("top", "1:active 2:warm", Duration::from_secs(60));
    // A visitor as a browser is: the page, then its WebSocket with the
    // cookie the page set (the page load holds the place until then).
    let page = get(port, "/", &[]).unwrap();
    assert_eq!((page.status, page.copy()), (200, Some(1)));
    let session = Session::open(port, &page.cookie().expect("placed"));
    assert_eq!(session.copy, 1);

    // Copy 1 is full and the app is at max-replicas: held, then the busy page.
    let t = Instant::now();
    let busy = get(port, "/", &[]).unwrap();
    let held = t.elapsed();
    assert_eq!(busy.status, 503, "{}", busy.body);
    assert!(busy.header("retry-after").is_some(), "Retry-After");
    assert!(busy.body.contains("top is busy") && busy.body.contains("http-equiv=\"refresh\""), "a page that reloads itself: {}", busy.body);
    assert!(held >= Duration::from_secs(3) && held < Duration::from_secs(6), "held for request-timeout: {held:?}");
    assert_eq!(env.roles("top"), "1:active 2:warm", "the spare stays a spare at the top");

    // A visitor held while the session ends gets in.
    let closer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(1));
        session.close();
    });
    let t = Instant::now();
    let served = get(port, "/", &[]).unwrap();
    closer.join().unwrap();
    assert_eq!((served.status, served.copy()), (200, Some(1)), "{}", served.body);
    assert!(t.elapsed() < Duration::from_secs(3), "served once the place freed: {:?}", t.elapsed());
}

#[test]
fn an_app_grows_no_copy_past_shinyctl_max_memory_and_status_says_so() {
    // A bound no copy fits under: the app stays at `replicas`, its spare
    // taking the visitors past max-sessions, and is not given another.
    let env = Env::new("capmem");
    let mut cmd = std::process::Command::new(bin());
    cmd.arg("serve").env("SHINYCTL_MAX_MEMORY", "16M");
    env.start_daemon(cmd);
    let extra = "replicas: 1\nwarm-replicas: 1\nmax-replicas: 3\nmax-sessions: 1\nscale-at: 1\n";
    let port = env.started("bound", extra, "1:active 2:warm");
    // The sampler has read both copies (their CPU share needs two of its
    // readings; their memory, which the bound counts, comes with the first).
    wait_until(Duration::from_secs(30), "the copies sampled", || {
        let v = env.status();
        let copies = v["apps"][0]["copies"].as_array().cloned().unwrap_or_default();
        (copies.len() == 2 && copies.iter().all(|c| c["cpu_percent"].is_number())).then_some(())
    });
    let sessions: Vec<Session> = (0..3).map(|_| Session::open(port, "")).collect();
    let text = wait_until(Duration::from_secs(30), "the line saying the memory bound holds it", || {
        let text = env.ok(&["status", "bound"]);
        text.contains("does not grow past").then_some(text)
    });
    assert!(text.contains("SHINYCTL_MAX_MEMORY"), "{text}");
    holds_for(Duration::from_secs(8), "no third copy to start", || env.copies("bound").len() <= 2);
    drop(sessions);
}
