//! The load balancer against hostile clients and hostile requests, with
//! real R (issue 8, part 2): a stopped copy, a request that kills its copy,
//! a POST that must not be replayed, forwarded headers, a short hostile
//! client, and running out of descriptors.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::helpers::*;

/// The test app: the usual page (`copy=N;`), plus `/echo` (the request's
/// headers, one `HTTP_…=value` a line), `/plant` (sets a sticky cookie of
/// another port's name), `/crash` (the copy kills itself
/// mid-request) and `/post` (says so in the copy's log, then kills itself).
const HOSTILE_R: &str = r#"
library(shiny)
shiny:::handlerManager$addHandler(function(req) {
  path <- req$PATH_INFO
  if (identical(path, "/echo")) {
    hs <- ls(req, pattern = "^HTTP_")
    lines <- vapply(hs, function(h) paste0(h, "=", get(h, envir = req)), "")
    return(httpResponse(200, "text/plain", paste0("copy=", Sys.getenv("SHINYCTL_COPY"), ";\n", paste(lines, collapse = "\n"), "\n")))
  }
  if (identical(path, "/plant")) {
    return(httpResponse(200, "text/plain", "planted\n",
      headers = list("Set-Cookie" = "lb_1=1.0123456789abcdef; Path=/", "X-Also" = "kept")))
  }
  if (identical(path, "/crash")) tools::pskill(Sys.getpid(), tools::SIGKILL)
  if (identical(path, "/post")) {
    cat("hostile-post-received\n", file = stderr())
    tools::pskill(Sys.getpid(), tools::SIGKILL)
  }
  NULL
}, "hostile-test")
ui <- fluidPage(tags$p(id = "who", paste0("copy=", Sys.getenv("SHINYCTL_COPY"), ";")))
server <- function(input, output, session) {}
shinyApp(ui, server)
"#;

/// Writes the test app with `extra` manifest lines, applies it and waits
/// for `roles`; returns the manifest and the public port.
fn started(env: &Env, name: &str, extra: &str, roles: &str) -> (PathBuf, u16) {
    let port = free_port();
    let manifest = write_app(env, name, port, extra);
    env.apply(&manifest);
    env.wait_roles(name, roles, Duration::from_secs(60));
    wait_http_ok(port, Duration::from_secs(10));
    (manifest, port)
}

/// The app folder with [`HOSTILE_R`] and its manifest.
fn write_app(env: &Env, name: &str, port: u16, extra: &str) -> PathBuf {
    env.app_running(HOSTILE_R, name, port, extra)
}

/// `GET path` as a new visitor, given up after `within` (the request goes
/// on in a thread of its own until the load balancer answers or closes).
fn get_within(port: u16, path: &str, within: Duration) -> Option<Response> {
    let (tx, rx) = mpsc::channel();
    let path = path.to_string();
    std::thread::spawn(move || {
        let _ = tx.send(get(port, &path, &[]));
    });
    rx.recv_timeout(within).ok().and_then(Result::ok)
}

/// Sends SIGCONT to a stopped copy when dropped, so a failing test leaves
/// no process that SIGTERM cannot end.
struct Continue(u32);

impl Drop for Continue {
    fn drop(&mut self) {
        signal(self.0, libc::SIGCONT);
    }
}

#[test]
fn a_stopped_copy_gets_no_new_visitors_status_says_so_and_it_is_used_again_once_it_runs() {
    let env = Env::new("stall");
    let (_, port) = started(&env, "stall", "replicas: 2\nwarm-replicas: 0\nlb-policy: first\n", "1:active 2:active");
    assert_eq!(get(port, "/", &[]).unwrap().copy(), Some(1), "lb-policy first: copy 1 takes new visitors");
    let pid = env.pid_of("stall", 1);
    let resume = Continue(pid);
    signal(pid, libc::SIGSTOP);
    let stopped = Instant::now();
    // The first visitors wait on the stopped copy and give up; within a few
    // seconds new visitors go to copy 2.
    wait_until(Duration::from_secs(30), "new visitors to go to copy 2", || {
        get_within(port, "/", Duration::from_secs(2)).filter(|r| r.copy() == Some(2))
    });
    assert!(stopped.elapsed() < Duration::from_secs(15), "within a few seconds: {:?}", stopped.elapsed());
    for _ in 0..5 {
        let r = get_within(port, "/", Duration::from_secs(5)).expect("an answer while copy 1 is stopped");
        assert_eq!((r.status, r.copy()), (200, Some(2)), "{r:?}");
    }
    let line = wait_until(Duration::from_secs(15), "the status line about copy 1", || {
        env.status_text(None).lines().find(|l| l.contains("copy 1 has not answered for")).map(str::to_string)
    });
    assert!(line.starts_with("stall: copy 1 has not answered for "), "{line}");
    drop(resume);
    wait_until(Duration::from_secs(30), "copy 1 to take new visitors again", || {
        get_within(port, "/", Duration::from_secs(5)).filter(|r| r.copy() == Some(1))
    });
    wait_until(Duration::from_secs(15), "the status line to go", || (!env.status_text(None).contains("has not answered")).then_some(()));
    assert!(env.copies("stall").iter().all(|c| c.crashes == 0), "a stopped copy is not a dead one");
}

#[test]
fn a_get_that_kills_its_copy_takes_at_most_two_copies_and_the_app_keeps_answering() {
    let env = Env::new("death");
    let (_, port) = started(&env, "death", "replicas: 2\nwarm-replicas: 1\n", "1:active 2:active 3:warm");
    let before: Vec<(u32, u32)> = env.copies("death").iter().map(|c| (c.copy, c.pid.unwrap())).collect();
    let first = get(port, "/crash?x=1", &[]).unwrap();
    assert_eq!(first.status, 502, "{first:?}");
    // The one request cost two copies: lost on the first, it was sent once
    // more, to another, which it killed too.
    let dead = || before.iter().filter(|(_, pid)| !pid_alive(*pid)).count();
    wait_until(Duration::from_secs(5), "the second copy the GET was sent to to be dead", || (dead() >= 2).then_some(()));
    assert_eq!(dead(), 2, "sent again once only: {before:?} → {:?}", env.copies("death"));
    let t = Instant::now();
    let again = get(port, "/crash?x=1", &[]).unwrap();
    assert_eq!(again.status, 502, "{again:?}");
    assert!(t.elapsed() < Duration::from_secs(1), "refused at once: {:?}", t.elapsed());
    for _ in 0..10 {
        let r = get(port, "/", &[]).unwrap();
        assert_eq!(r.status, 200, "the app keeps answering: {r:?}");
    }
    let line = wait_until(Duration::from_secs(10), "the status line about the request", || {
        env.status_text(None).lines().find(|l| l.contains("GET /crash?x=1 was in flight when two copies died")).map(str::to_string)
    });
    assert!(line.starts_with("death: "), "{line}");
    // The dead copies come back; the one left standing never went.
    wait_until(Duration::from_secs(60), "three ready copies again", || {
        let c = env.copies("death");
        (c.iter().filter(|c| c.ready).count() == 3).then_some(())
    });
    let after = env.copies("death");
    let died = before.iter().filter(|(copy, pid)| after.iter().find(|c| c.copy == *copy).and_then(|c| c.pid) != Some(*pid)).count();
    assert_eq!(died, 2, "the refused request killed none: {before:?} → {after:?}");
}

#[test]
fn a_post_is_never_replayed() {
    let env = Env::new("post");
    let (_, port) = started(&env, "post", "replicas: 2\nwarm-replicas: 1\n", "1:active 2:active 3:warm");
    let r = http(port, "POST", "/post", &[("Content-Length", "0")]).unwrap();
    assert_eq!(r.status, 502, "{r:?}");
    // Any replay would have happened by now; give the logs a moment.
    holds_for(Duration::from_secs(3), "one POST seen by the app", || posts_seen(&env) <= 1);
    assert_eq!(posts_seen(&env), 1, "the app saw the POST once");
    assert_eq!(get(port, "/", &[]).unwrap().status, 200);
}

/// How many times the copies' logs say a POST reached the app.
fn posts_seen(env: &Env) -> usize {
    let Ok(dir) = std::fs::read_dir(env.home().join("logs")) else { return 0 };
    dir.filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok()).map(|log| log.matches("hostile-post-received").count()).sum()
}

#[test]
fn a_visitors_forwarded_headers_never_reach_the_app_and_a_trusted_proxys_do() {
    let env = Env::new("fwd");
    let (manifest, port) = started(&env, "fwd", "warm-replicas: 0\n", "1:active");
    let spoof = [
        ("Forwarded", "for=6.6.6.6;proto=https"),
        ("X-Real-IP", "6.6.6.6"),
        ("X-Forwarded-Host", "evil.example"),
        ("X-Forwarded-For", "203.0.113.9"),
    ];
    let r = get(port, "/echo", &spoof).unwrap();
    assert_eq!(r.status, 200, "{r:?}");
    assert!(!r.body.contains("6.6.6.6") && !r.body.contains("evil.example") && !r.body.contains("203.0.113.9"), "{}", r.body);
    assert!(r.body.contains("HTTP_X_FORWARDED_FOR=127.0.0.1\n") && r.body.contains("HTTP_X_REAL_IP=127.0.0.1\n"), "{}", r.body);
    // R's web server reads `_` as `-`: the underscore spellings are dropped.
    let underscored = [("X_Forwarded_For", "6.6.6.6"), ("X-Real_IP", "6.6.6.6"), ("X_Forwarded-Proto", "https")];
    let r = get(port, "/echo", &underscored).unwrap();
    assert!(!r.body.contains("6.6.6.6") && !r.body.contains("PROTO=https"), "{}", r.body);
    assert!(r.body.contains("HTTP_X_FORWARDED_FOR=127.0.0.1\n") && r.body.contains("HTTP_X_REAL_IP=127.0.0.1\n"), "{}", r.body);
    let pid = env.pid_of("fwd", 1);
    // An app cannot place its visitors on a copy, its own or another app's:
    // its Set-Cookie of a sticky cookie's name is dropped (a browser sends
    // a host's cookies to every port).
    let r = get(port, "/plant", &[]).unwrap();
    assert_eq!((r.status, r.body.as_str(), r.header("x-also")), (200, "planted\n", Some("kept")), "{r:?}");
    let planted: Vec<&(String, String)> =
        r.headers.iter().filter(|(k, v)| k.eq_ignore_ascii_case("set-cookie") && v.starts_with("lb_1=")).collect();
    assert!(planted.is_empty(), "{r:?}");

    // Trusting this machine's proxies changes no copy.
    std::fs::write(&manifest, format!("app-name: fwd\nport: {port}\nwarm-replicas: 0\ntrusted-proxies: [127.0.0.1]\n")).unwrap();
    env.apply(&manifest);
    let r = wait_until(Duration::from_secs(15), "the trusted proxy's X-Forwarded-For to reach the app", || {
        get(port, "/echo", &[("X-Forwarded-For", "203.0.113.9"), ("X-Forwarded-Proto", "https")])
            .ok()
            .filter(|r| r.body.contains("HTTP_X_FORWARDED_FOR=203.0.113.9, 127.0.0.1\n"))
    });
    assert!(r.body.contains("HTTP_X_FORWARDED_PROTO=https\n"), "{}", r.body);
    assert_eq!(env.pid_of("fwd", 1), pid, "no copy was restarted");
}

/// A connection that sent `bytes` and is left open.
fn opened(port: u16, bytes: &[u8]) -> Option<TcpStream> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.write_all(bytes).ok()?;
    Some(s)
}

/// Sends `raw` and reads whatever comes back within 10 s (the status line's
/// code, 0 for a close without an answer).
fn answer_to(port: u16, raw: &[u8]) -> u16 {
    let Some(mut s) = opened(port, raw) else { return 0 };
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    String::from_utf8_lossy(&got).split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0)
}

/// The short form of `bench/hostile.sh`: the hostile inputs, and what a
/// visitor meanwhile gets.
struct Hostile {
    /// Connections held open: idle, slow headers, a slow body.
    held: Vec<TcpStream>,
}

impl Hostile {
    fn start(port: u16, idle: usize) -> Hostile {
        let mut held = Vec::new();
        held.extend((0..idle).filter_map(|_| opened(port, b"")));
        held.extend((0..20).filter_map(|_| opened(port, b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")));
        held.extend(opened(port, b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\nabc"));
        Hostile { held }
    }

    /// One more byte on every slow connection.
    fn trickle(&mut self) {
        for s in &mut self.held {
            let _ = s.write_all(b"a");
        }
    }
}

#[test]
fn hostile_clients_leave_other_visitors_answered_no_copy_down_and_no_panic() {
    let env = Env::new("hostile");
    let (_, port) = started(&env, "hostile", "replicas: 2\nwarm-replicas: 1\n", "1:active 2:active 3:warm");
    let pids: Vec<Option<u32>> = env.copies("hostile").iter().map(|c| c.pid).collect();
    let mut hostile = Hostile::start(port, 300);
    assert!(hostile.held.len() > 300, "the hostile connections are open: {}", hostile.held.len());
    let visitors = Loop::start(port);
    let huge = format!("GET / HTTP/1.1\r\nHost: x\r\nX-Huge: {}\r\n\r\n", "a".repeat(70 * 1024));
    assert_eq!(answer_to(port, huge.as_bytes()), 431, "huge headers");
    // Malformed handshakes get exactly their status (RFC 6455, 4.2.1 and
    // 4.2.2), from the load balancer; a good one switches.
    let key = "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n";
    for (upgrade, want) in [
        ("GET /websocket/ HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n".to_string(), 400),
        (
            "GET /websocket/ HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: !!\r\nSec-WebSocket-Version: 13\r\n\r\n"
                .to_string(),
            400,
        ),
        (format!("GET /websocket/ HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n{key}Sec-WebSocket-Version: 99\r\n\r\n"), 426),
        (
            format!("GET /websocket/ HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, Upgrade, Upgrade\r\nUpgrade: h2c, websocket\r\n{key}Sec-WebSocket-Version: 13\r\nContent-Length: 5\r\n\r\nhello"),
            400,
        ),
        (format!("GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n{key}\r\n"), 101),
    ] {
        assert_eq!(answer_to(port, upgrade.as_bytes()), want, "for {upgrade:?}");
    }
    for _ in 0..5 {
        std::thread::sleep(Duration::from_secs(1));
        hostile.trickle();
    }
    let (sent, errors) = visitors.finish();
    assert!(sent > 20, "visitors kept sending: {sent}");
    assert!(errors.is_empty(), "every other visitor was answered: {errors:?} of {sent}");
    drop(hostile);
    let after: Vec<Option<u32>> = env.copies("hostile").iter().map(|c| c.pid).collect();
    assert_eq!(after, pids, "no copy died or was restarted");
    env.wait_roles("hostile", "1:active 2:active 3:warm", Duration::from_secs(5));
    let log = std::fs::read_to_string(env.home().join("api.log")).unwrap_or_default();
    assert!(!log.contains("panicked"), "a panic in api.log");
    assert!(!log.contains("it gets no visitor until it comes back"), "a copy was marked down");
}

#[test]
fn out_of_descriptors_the_load_balancer_answers_503_and_blames_no_copy() {
    raise_own_open_files();
    let env = Env::new("nofile");
    let port = free_port();
    let manifest = write_app(&env, "nofile", port, "replicas: 2\nwarm-replicas: 1\n");
    // The daemon, and so the load balancer it starts, inherit both limits:
    // raising the soft one cannot undo it.
    let out = std::process::Command::new("prlimit")
        .args(["--nofile=1024:1024", bin(), "apply", "-f", manifest.to_str().unwrap()])
        .env("SHINYCTL_HOME", env.home())
        .output()
        .expect("prlimit runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    env.wait_roles("nofile", "1:active 2:active 3:warm", Duration::from_secs(60));
    wait_http_ok(port, Duration::from_secs(10));
    let proxy = env.status()["proxy_pid"].as_u64().expect("a load balancer") as u32;
    let limits = std::fs::read_to_string(format!("/proc/{proxy}/limits")).unwrap();
    let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap().to_string();
    assert!(line.split_whitespace().filter(|w| *w == "1024").count() == 2, "{line}");

    // Past the descriptors' budget ((1024 - 64) / 2 = 480 visitors'
    // connections, each may need one to a copy) a visitor gets a 503...
    let mut held: Vec<TcpStream> = (0..500).filter_map(|_| TcpStream::connect(("127.0.0.1", port)).ok()).collect();
    let r = wait_until(Duration::from_secs(10), "a 503 while the descriptors are taken", || {
        http(port, "GET", "/", &[]).ok().filter(|r| r.status == 503)
    });
    assert_eq!(r.header("retry-after"), Some("5"), "{r:?}");
    // ...and far past it, a close; never a 502 or a wait.
    held.extend((0..600).filter_map(|_| TcpStream::connect(("127.0.0.1", port)).ok()));
    for _ in 0..20 {
        let t = Instant::now();
        match http(port, "GET", "/", &[]) {
            Ok(r) => assert_eq!(r.status, 503, "{r:?}"),
            Err(e) => assert!(t.elapsed() < Duration::from_secs(5), "closed at once, not after {:?}: {e}", t.elapsed()),
        }
    }
    drop(held);
    wait_until(Duration::from_secs(20), "answers again once they are closed", || get(port, "/", &[]).ok().filter(|r| r.status == 200));
    env.wait_roles("nofile", "1:active 2:active 3:warm", Duration::from_secs(5));
    let log = std::fs::read_to_string(env.home().join("api.log")).unwrap_or_default();
    assert!(!log.contains("it gets no visitor until it comes back"), "a copy was blamed");
    assert!(!log.contains("panicked"), "a panic in api.log");
}

/// This test process opens more connections than a soft limit of 1024
/// allows: its soft limit goes up to its hard one.
fn raise_own_open_files() {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit only read and write the struct given.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// Connects to `to:port` from `from`, in the network namespace of `pid`
/// (entered by a thread of its own, so the test's other threads stay in
/// the machine's); returns the connected sockets, `n` of them.
fn connect_from_namespace(pid: u32, from: [u8; 4], to: [u8; 4], port: u16, n: usize) -> Vec<TcpStream> {
    std::thread::spawn(move || {
        let ns = std::fs::File::open(format!("/proc/{pid}/ns/net")).expect("the daemon's network namespace");
        nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns into the test's own network namespace");
        (0..n)
            .map(|_| {
                let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
                s.bind(&std::net::SocketAddr::from((from, 0)).into()).unwrap();
                s.connect(&std::net::SocketAddr::from((to, port)).into()).unwrap();
                TcpStream::from(s)
            })
            .collect()
    })
    .join()
    .unwrap()
}

/// The status line and headers of the answer to a GET on `s`.
fn head_of_answer(s: &mut TcpStream) -> String {
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    let text = String::from_utf8_lossy(&got).into_owned();
    text.split("\r\n\r\n").next().unwrap_or_default().to_string()
}

/// The per-address cap and its loopback exemption with traffic from an
/// address that is not loopback: the whole of shinyctl runs in a user and
/// network namespace the test makes (the machine's own interfaces are not
/// touched), with 192.0.2.2/32 on that namespace's own `lo`. From
/// 192.0.2.2, 256 connections are taken and the next is answered 503 with
/// Retry-After; from 127.0.0.1, as many and more are served.
#[test]
fn the_per_address_cap_holds_for_a_visitor_and_loopback_is_exempt() {
    let env = Env::new("peraddr");
    let script = "ip link set lo up && ip addr add 192.0.2.2/32 dev lo && exec \"$@\"";
    let daemon = crate::launcher::serve_through(&env, "unshare", &["--user", "--map-root-user", "--net", "sh", "-c", script, "sh"]);
    let port = free_port();
    env.apply(&write_app(&env, "peraddr", port, "warm-replicas: 0\nhost: 0.0.0.0\nmax-connections: 4000\n"));
    env.wait_roles("peraddr", "1:active", Duration::from_secs(60));
    let visitor = [192, 0, 2, 2];
    let answered = wait_until(Duration::from_secs(20), "the app to answer in its namespace", || {
        let mut one = connect_from_namespace(daemon, visitor, visitor, port, 1).pop()?;
        Some(head_of_answer(&mut one)).filter(|h| h.starts_with("HTTP/1.1 200"))
    });
    assert!(answered.contains("200"), "{answered}");

    let held = connect_from_namespace(daemon, visitor, visitor, port, 256);
    // Taken in by the load balancer, before the next: it admits connections
    // in the order it accepts them, before its open count takes them in.
    let sock = env.home().join("proxy/proxy.sock");
    wait_until(Duration::from_secs(20), "the load balancer to hold the 256 connections", || {
        let (_, body) = shinyctl::wire::uds::request_blocking(&sock, hyper::Method::GET, "/metrics", None, Duration::from_secs(5)).ok()?;
        let m: serde_json::Value = serde_json::from_slice(&body).ok()?;
        (m["open_connections"].as_u64()? >= 256).then_some(())
    });
    let mut over = connect_from_namespace(daemon, visitor, visitor, port, 1).pop().unwrap();
    let head = head_of_answer(&mut over);
    assert!(head.starts_with("HTTP/1.1 503"), "the 257th connection from 192.0.2.2 is past the cap: {head}");
    assert!(head.to_lowercase().contains("retry-after: 5"), "{head}");

    let lo = [127, 0, 0, 1];
    let held_lo = connect_from_namespace(daemon, lo, visitor, port, 300);
    wait_until(Duration::from_secs(20), "the load balancer to hold the 300 more", || {
        let (_, body) = shinyctl::wire::uds::request_blocking(&sock, hyper::Method::GET, "/metrics", None, Duration::from_secs(5)).ok()?;
        let m: serde_json::Value = serde_json::from_slice(&body).ok()?;
        (m["open_connections"].as_u64()? >= 556).then_some(())
    });
    let mut more = connect_from_namespace(daemon, lo, visitor, port, 1).pop().unwrap();
    let head = head_of_answer(&mut more);
    assert!(head.starts_with("HTTP/1.1 200"), "loopback is not capped per address, past 300 connections: {head}");
    drop(held);
    wait_until(Duration::from_secs(20), "192.0.2.2 to be served again once its connections closed", || {
        let mut again = connect_from_namespace(daemon, visitor, visitor, port, 1).pop()?;
        head_of_answer(&mut again).starts_with("HTTP/1.1 200").then_some(())
    });
    drop(held_lo);
}

/// The load balancer's open visitor connections (and sessions), from its
/// own figures on `proxy.sock`.
fn open_connections(env: &Env) -> Option<u64> {
    let sock = env.home().join("proxy/proxy.sock");
    let (_, body) = shinyctl::wire::uds::request_blocking(&sock, hyper::Method::GET, "/metrics", None, Duration::from_secs(5)).ok()?;
    serde_json::from_slice::<serde_json::Value>(&body).ok()?["open_connections"].as_u64()
}

/// A visitor that stops reading a long answer (its window stays shut) is
/// ended after 60 s without progress, not before, and not never.
#[test]
fn a_visitor_that_stops_reading_is_ended_after_sixty_seconds() {
    let env = Env::new("stopsreading");
    let port = free_port();
    let manifest = write_app(&env, "stops", port, "warm-replicas: 0\n");
    let www = manifest.parent().unwrap().join("www");
    std::fs::create_dir_all(&www).unwrap();
    std::fs::write(www.join("big.bin"), vec![b'x'; 48 << 20]).unwrap();
    env.apply(&manifest);
    env.wait_roles("stops", "1:active", Duration::from_secs(60));
    wait_http_ok(port, Duration::from_secs(10));
    wait_until(Duration::from_secs(10), "no visitor connection open", || (open_connections(&env)? == 0).then_some(()));

    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"GET /big.bin HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut head = [0u8; 64];
    s.read_exact(&mut head).unwrap();
    assert!(head.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&head));
    let stopped = Instant::now();
    // From here on nothing is read.
    wait_until(Duration::from_secs(10), "the load balancer to count the visitor", || (open_connections(&env)? == 1).then_some(()));
    wait_until(Duration::from_secs(120), "the visitor that stopped reading to be ended", || (open_connections(&env)? == 0).then_some(()));
    let after = stopped.elapsed();
    assert!(after >= Duration::from_secs(55), "not before 60 s without progress: {after:?}");
    assert!(after <= slow(Duration::from_secs(100)), "at 60 s without progress, not much later: {after:?}");
    drop(s);
    assert_eq!(get(port, "/", &[]).unwrap().status, 200, "the app serves on");
}
