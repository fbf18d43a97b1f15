//! The load balancer with real Shiny apps: sticky cookies, lb-policy,
//! WebSockets and sessions, X-Forwarded-For, the stand-in.

use std::time::Duration;

use crate::helpers::*;

const START: Duration = Duration::from_secs(60);

#[test]
fn the_cookie_holds_a_visitor_on_one_copy_and_a_forged_one_is_replaced() {
    let env = Env::new("sticky");
    let port = env.started("sticky", "replicas: 2\nwarm-replicas: 0\nlb-policy: round-robin\n", "1:active 2:active");

    let first = get(port, "/", &[]).unwrap();
    let set = first.header("set-cookie").expect("a new visitor gets a cookie").to_string();
    let name = format!("lb_{port}=");
    assert!(set.starts_with(&name), "{set}");
    for attr in ["HttpOnly", "SameSite=Lax", "Path=/"] {
        assert!(set.contains(attr), "{attr} in {set}");
    }
    let cookie = first.cookie().unwrap();
    let home = first.copy().unwrap();
    for _ in 0..10 {
        let r = get(port, "/", &[("Cookie", &cookie)]).unwrap();
        assert_eq!(r.copy(), Some(home), "the cookie keeps the visitor on copy {home}");
    }

    // A forged cookie naming the other copy is ignored and replaced.
    let other = if home == 1 { 2 } else { 1 };
    let forged = format!("lb_{port}={other}.0000000000000000000000000000000000000000000000000000000000000000");
    let mut placed = std::collections::BTreeSet::new();
    for _ in 0..4 {
        let r = get(port, "/", &[("Cookie", &forged)]).unwrap();
        let fresh = r.cookie().expect("a forged cookie is replaced");
        assert_ne!(fresh, forged);
        placed.insert(r.copy().unwrap());
    }
    assert_eq!(placed.len(), 2, "visitors with a forged cookie are placed anew by the policy, not by the cookie");
    for garbage in ["x", "1", "1.zz", "99999999999.ab", ""] {
        let r = get(port, "/", &[("Cookie", &format!("lb_{port}={garbage}"))]).unwrap();
        assert_eq!(r.status, 200, "cookie {garbage:?}");
    }
}

#[test]
fn each_lb_policy_spreads_new_visitors_as_documented() {
    let env = Env::new("policies");
    let port = env.started("spread", "replicas: 2\nwarm-replicas: 1\nlb-policy: first\n", "1:active 2:active 3:warm");
    let manifest = env.dir.join("apps/spread/app.yaml");
    let visit = |n: usize| -> Vec<u32> { (0..n).map(|_| get(port, "/", &[]).unwrap().copy().unwrap()).collect() };
    let alternates = |v: &[u32]| v.windows(2).all(|w| w[0] != w[1]);

    // A session held on copy 1: least-conn would now send visitors to copy 2.
    let held = Session::open(port, "");
    assert_eq!(held.copy, 1);
    assert_eq!(visit(6), vec![1; 6], "first: always the oldest active copy, however busy");
    held.close();

    let set_policy = |p: &str| {
        std::fs::write(&manifest, format!("app-name: spread\nport: {port}\nreplicas: 2\nwarm-replicas: 1\nlb-policy: {p}\n")).unwrap();
        let out = env.apply(&manifest);
        assert!(out.contains("without restarting"), "{out}");
        // proxy/table.json is written once the load balancer took the table.
        wait_until(Duration::from_secs(20), &format!("the load balancer to take lb-policy {p}"), || {
            let table: serde_json::Value = serde_json::from_slice(&std::fs::read(env.home().join("proxy/table.json")).ok()?).ok()?;
            table["apps"].as_array()?.iter().any(|a| a["name"] == "spread" && a["policy"] == p).then_some(())
        });
    };
    set_policy("round-robin");
    let seen = visit(10);
    assert!(alternates(&seen), "round-robin: strictly in turn: {seen:?}");
    assert!(seen.iter().all(|c| *c == 1 || *c == 2), "only active copies, never the warm one: {seen:?}");

    set_policy("random");
    // Strict alternation, or one copy only, over 40 visits: 1 in 2^38 for a fair coin.
    let seen = visit(40);
    assert!(!alternates(&seen), "random is not in turn: {seen:?}");
    let reached: std::collections::BTreeSet<u32> = seen.iter().copied().collect();
    assert_eq!(reached, [1, 2].into_iter().collect(), "random: any active copy, never the warm one: {seen:?}");

    set_policy("least-conn");
    // Hold two sessions on copy 1; new visitors then go to copy 2, which has fewer.
    let c1 = format!("lb_{port}={}", env_cookie_for(port, 1));
    let s1 = Session::open(port, &c1);
    let s2 = Session::open(port, &c1);
    assert_eq!((s1.copy, s2.copy), (1, 1));
    assert_eq!(visit(5), vec![2; 5], "least-conn: the copy with the fewest open connections");
    s1.close();
    s2.close();
}

/// A valid cookie value for a copy, learnt by visiting until placed there.
fn env_cookie_for(port: u16, copy: u32) -> String {
    wait_until(Duration::from_secs(10), "a visit placed on the copy", || {
        let r = get(port, "/", &[]).ok()?;
        (r.copy() == Some(copy)).then(|| r.cookie().unwrap().split_once('=').unwrap().1.to_string())
    })
}

#[test]
fn a_shiny_session_runs_over_the_websocket_and_is_counted() {
    let env = Env::new("websocket");
    let port = env.started("ws", "", "1:active 2:warm");
    let session = Session::open(port, "");
    assert_eq!(session.copy, 1, "the session reached the active copy and Shiny rendered its output");
    wait_until(Duration::from_secs(10), "SESSIONS 1 on copy 1", || {
        env.copies("ws").iter().any(|c| c.copy == 1 && c.sessions == 1).then_some(())
    });
    let text = env.ok(&["status", "ws"]);
    let row: Vec<&str> = text.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(row[8], "1", "SESSIONS column: {text}");
    session.close();
    wait_until(Duration::from_secs(10), "SESSIONS back to 0", || env.copies("ws").iter().all(|c| c.sessions == 0).then_some(()));
}

#[test]
fn x_forwarded_for_is_the_visitors_address_and_an_incoming_one_is_not_trusted() {
    let env = Env::new("xff");
    let port = env.started("xff", "warm-replicas: 0\n", "1:active");
    let r = get(port, "/", &[("X-Forwarded-For", "6.6.6.6")]).unwrap();
    assert_eq!(between(&r.body, "xff=", ";"), Some("127.0.0.1"), "{}", r.body);
}

/// The test app plus `/slow`: it leaves a mark on the copy's own disk,
/// then answers `copy=N;` 3 s later.
const SLOW_R: &str = r#"
library(shiny)
shiny:::handlerManager$addHandler(function(req) {
  if (!identical(req$PATH_INFO, "/slow")) return(NULL)
  writeLines("begun", file.path(Sys.getenv("SHINYCTL_SCRATCH"), "slow-begun"))
  Sys.sleep(3)
  httpResponse(200, "text/plain", paste0("copy=", Sys.getenv("SHINYCTL_COPY"), ";"))
}, "slow-test")
ui <- fluidPage(tags$p(id = "who", paste0("copy=", Sys.getenv("SHINYCTL_COPY"), ";")))
server <- function(input, output, session) {}
shinyApp(ui, server)
"#;

#[test]
fn killing_the_active_copy_loses_no_request_and_the_visitor_ends_on_the_spare() {
    let env = Env::new("failover");
    let port = free_port();
    env.apply(&env.app_running(SLOW_R, "fo", port, ""));
    env.wait_roles("fo", "1:active 2:warm", START);
    let first = wait_http_ok(port, Duration::from_secs(10));
    assert_eq!(first.copy(), Some(1));
    let cookie = first.cookie().unwrap();

    let client = Loop::sticky(port, cookie);
    wait_until(Duration::from_secs(30), "the client to be running", || (client.sent() > 20).then_some(()));
    // A request surely in flight to copy 1 when it dies: copy 1 is in the
    // middle of answering it.
    let slow = std::thread::spawn(move || get(port, "/slow", &[]));
    let mark = env.home().join("scratch").join("default-fo").join("1").join("slow-begun");
    wait_until(Duration::from_secs(10), "copy 1 to be answering /slow", || mark.exists().then_some(()));
    signal(env.pid_of("fo", 1), 9);
    let at_kill = client.sent();
    let answer = slow.join().unwrap().expect("an answer to the request in flight at the kill");
    assert_eq!((answer.status, answer.copy()), (200, Some(2)), "sent again, to the spare: {answer:?}");
    wait_until(Duration::from_secs(60), "requests after the kill", || (client.sent() > at_kill + 100).then_some(()));
    let last_copy = client.last_copy();
    let (sent, errors) = client.finish();
    assert!(errors.is_empty(), "no request lost of {sent}: {errors:?}");
    assert_eq!(last_copy, 2, "the visitor ends on the spare");
    // The spare was made active, and the dead copy came back as the new spare.
    env.wait_roles("fo", "2:active 1:warm", START);
}

/// An R holding 600 MiB, which the kernel frees before it closes the
/// sockets of a killed R (60 ms here, against 25 for a bare shiny), whose
/// copy 1 answers `/slow` only after a minute and copy 2 at once.
const HEAVY_R: &str = r#"
library(shiny)
heavy <- rep(1, 8e7)
shiny:::handlerManager$addHandler(function(req) {
  if (!identical(req$PATH_INFO, "/slow")) return(NULL)
  if (Sys.getenv("SHINYCTL_COPY") == "1") {
    writeLines("begun", file.path(Sys.getenv("SHINYCTL_SCRATCH"), "slow-begun"))
    Sys.sleep(60)
  }
  httpResponse(200, "text/plain", paste0("copy=", Sys.getenv("SHINYCTL_COPY"), ";"))
}, "slow-test")
ui <- fluidPage(tags$p(id = "who", paste0("copy=", Sys.getenv("SHINYCTL_COPY"), ";")))
shinyApp(ui, function(input, output, session) {})
"#;

/// Copies of every socket process `pid` has open (pidfd_getfd), which
/// keep them open while held, whatever becomes of the process.
fn hold_sockets(pid: u32) -> Vec<std::os::fd::OwnedFd> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) };
    assert!(pidfd >= 0, "pidfd_open({pid}): {}", std::io::Error::last_os_error());
    // SAFETY: a new fd that nothing else owns.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as i32) };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap();
    fds.filter_map(|e| {
        let e = e.ok()?;
        std::fs::read_link(e.path()).ok()?.to_str()?.starts_with("socket:").then_some(())?;
        let fd: libc::c_int = e.file_name().to_str()?.parse().ok()?;
        // SAFETY: a valid pidfd, a descriptor number of that process, no flags.
        let got = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
        // SAFETY: as above.
        (got >= 0).then(|| unsafe { OwnedFd::from_raw_fd(got as i32) })
    })
    .collect()
}

/// README, "Staying up": a request in flight on a copy that dies goes to
/// the spare at once. A killed R frees its memory before its sockets
/// close, and a child it forked can keep them open for good: the load
/// balancer does not wait for them. Here the test holds the sockets of
/// copy 1's R itself, so they never close while the request is answered.
#[test]
fn a_request_on_a_killed_copy_goes_to_the_spare_while_the_copys_sockets_are_still_open() {
    if !needs_root("holds a copy's sockets open with pidfd_getfd") {
        return;
    }
    let env = Env::new("failover-early");
    let port = free_port();
    env.apply(&env.app_running(HEAVY_R, "fe", port, ""));
    env.wait_roles("fe", "1:active 2:warm", START);
    assert_eq!(wait_http_ok(port, Duration::from_secs(10)).copy(), Some(1));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(get(port, "/slow", &[])));
    let mark = env.home().join("scratch").join("default-fe").join("1").join("slow-begun");
    wait_until(Duration::from_secs(10), "copy 1 to be answering /slow", || mark.exists().then_some(()));
    let r = env.pid_of("fe", 1);
    // R starts threads as it serves; the load balancer watches them.
    let watched = format!("copy 1's process {r}: its threads");
    wait_until(Duration::from_secs(30), "the load balancer to watch copy 1's threads", || {
        std::fs::read_to_string(env.home().join("api.log")).unwrap_or_default().contains(&watched).then_some(())
    });
    let held = hold_sockets(r);
    assert!(held.len() >= 2, "copy 1's R has its listening socket and the request's connection open: {} held", held.len());
    signal(r, 9);
    let answer = rx.recv_timeout(slow(Duration::from_secs(10))).expect("an answer while copy 1's sockets are still open").unwrap();
    assert_eq!((answer.status, answer.copy()), (200, Some(2)), "sent again, to the spare: {answer:?}");
    drop(held);
    // Known from one of its other threads ending, not from the process's
    // own end, which comes only once its memory is freed.
    let log = std::fs::read_to_string(env.home().join("api.log")).unwrap();
    assert!(log.contains(&format!("copy 1's process {r} is ending (its thread")), "the load balancer's word on copy 1's end:\n{log}");
}

#[test]
fn without_a_spare_a_request_waits_for_the_app_to_come_back() {
    let env = Env::new("nospare");
    let port = env.started("alone", "warm-replicas: 0\n", "1:active");
    let pid = env.pid_of("alone", 1);
    signal(pid, 9);
    wait_gone(pid, Duration::from_secs(10), "the copy to be killed");
    // Held while copy 1 waits out its 2 s backoff and starts again.
    let r = get(port, "/", &[]).unwrap();
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.copy(), Some(1));
}

#[test]
fn with_no_copy_back_within_15_s_a_request_gets_the_restarting_page() {
    let env = Env::new("restarting");
    let port = free_port();
    // Its disk is kept through restarts: the second start hangs, so the
    // copy comes back, but not within the hold.
    env.apply(&env.app_running(&second_start("Sys.sleep(3600)"), "slow", port, "warm-replicas: 0\nidle-timeout: 0\n"));
    env.wait_roles("slow", "1:active", Duration::from_secs(60));
    let r = env.pid_of("slow", 1);
    signal(r, 9);
    wait_until(Duration::from_secs(20), "the copy to start again", || {
        env.copies("slow").iter().any(|c| c.pid.is_some_and(|p| p != r)).then_some(())
    });
    let asked = std::time::Instant::now();
    let resp = get(port, "/", &[]).unwrap();
    let held = asked.elapsed();
    assert_eq!(resp.status, 503);
    assert!(resp.header("retry-after").is_some(), "{resp:?}");
    assert!(resp.body.contains("restarting"), "a page saying the app is restarting: {}", resp.body);
    assert!(resp.body.contains("refresh") || resp.body.contains("reload"), "which reloads itself: {}", resp.body);
    // README, "Staying up": a request waits up to 15 seconds for the app to
    // come back; after that the visitor gets a page saying it is restarting.
    let spec_hold = Duration::from_secs(15);
    assert!(held >= spec_hold && held < spec_hold + Duration::from_secs(10), "held 15 s first, was {held:?}");
}

#[test]
fn with_every_copy_left_down_a_request_is_told_the_app_is_down_at_once() {
    let env = Env::new("leftdown");
    let port = env.started("down", "warm-replicas: 0\nrestart-policy: never\n", "1:active");
    signal(env.pid_of("down", 1), 9);
    wait_until(Duration::from_secs(5), "the copy to be left down", || {
        env.copies("down").iter().any(|c| c.status == "exited").then_some(())
    });
    // Nothing will bring a copy back until its operator acts: no hold, and
    // no page promising a restart.
    let resp = wait_until(Duration::from_secs(10), "the table saying the app is down", || {
        let asked = std::time::Instant::now();
        let resp = get(port, "/", &[]).ok()?;
        (asked.elapsed() < Duration::from_secs(2)).then_some(resp)
    });
    assert_eq!(resp.status, 503, "{resp:?}");
    assert!(resp.body.contains("is down") && !resp.body.contains("restarting"), "{}", resp.body);
    assert_eq!(get(port, "/.shinyctl/health", &[]).unwrap().status, 503);
    // A restart brings it back.
    env.ok(&["restart", "down", "--wait=60s"]);
    assert_eq!(wait_http_ok(port, Duration::from_secs(10)).status, 200);
}

#[test]
fn the_daemon_starts_the_load_balancer_again_when_it_dies() {
    let env = Env::new("proxydies");
    let port = env.started("lb", "warm-replicas: 0\n", "1:active");
    let proxy = env.status()["proxy_pid"].as_u64().unwrap() as u32;
    signal(proxy, 9);
    let again = wait_until(Duration::from_secs(10), "a new load balancer", || {
        env.status()["proxy_pid"].as_u64().map(|p| p as u32).filter(|p| *p != proxy && pid_alive(*p))
    });
    assert_ne!(again, proxy);
    let r = wait_http_ok(port, Duration::from_secs(10));
    assert_eq!(r.copy(), Some(1), "it got the table again and serves the same copy");
}

#[test]
fn hostile_input_gets_clear_errors_and_the_load_balancer_keeps_serving() {
    use std::io::{Read, Write};
    let env = Env::new("hostile");
    let port = env.started("tough", "warm-replicas: 0\n", "1:active");
    let proxy = env.status()["proxy_pid"].as_u64().unwrap() as u32;

    // A client that sends half a request and keeps the connection: others are served meanwhile.
    let mut slow = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    slow.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").unwrap();

    let raw = |bytes: &[u8]| -> String {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let _ = s.write_all(bytes);
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    };
    let garbage = raw(b"\x00\x01\x02 not http at all\r\n\r\n");
    assert!(garbage.starts_with("HTTP/1.1 400 "), "garbage gets a 400: {garbage:?}");
    let huge = format!("GET / HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n", "a".repeat(200_000));
    let answer = raw(huge.as_bytes());
    assert!(answer.starts_with("HTTP/1.1 431 "), "a head too large gets a 431: {answer:.80}");
    let answer = raw(b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n");
    assert!(answer.starts_with("HTTP/1.1 400 "), "a bad Content-Length gets a 400: {answer:.80}");
    let answer = raw(b"GET /websocket/ HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n");
    assert!(answer.starts_with("HTTP/1.1 400 "), "an upgrade without Sec-WebSocket-Key gets a 400: {answer:.80}");

    assert_eq!(get(port, "/", &[]).unwrap().status, 200, "still serving");
    assert!(pid_alive(proxy), "the load balancer did not crash");
    assert_eq!(env.status()["proxy_pid"].as_u64().unwrap() as u32, proxy, "and was not restarted");
    drop(slow);
}

/// A quiet Shiny session (nothing said for over a minute) is kept: the
/// idle limits of HTTP connections (30 s) and of answers that stop moving
/// (60 s) are not a tunnel's; TCP keepalive finds a dead peer instead.
#[test]
fn a_quiet_session_is_kept_past_the_idle_limits() {
    let env = Env::new("quiet");
    let port = env.started("quiet", "warm-replicas: 0\n", "1:active");
    let mut session = Session::open(port, "");
    session.still_on_its_copy(1);
    // Quiet on purpose, past both limits: this is the case under test, not a wait.
    std::thread::sleep(Duration::from_secs(75));
    session.still_on_its_copy(2);
    assert_eq!(env.copies("quiet")[0].sessions, 1, "still counted as the copy's session");
}
