//! Several machines behind a load balancer people already run: two
//! shinyctl homes on this machine stand for two hosts (the same app port on
//! 127.0.0.2 and 127.0.0.3, so both set a cookie of the same name with
//! different keys) behind a real HAProxy with the README's configuration.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::helpers::*;

/// The README's HAProxy configuration, with this test's addresses (and
/// quicker health checks, so the test doesn't wait for them).
fn haproxy_cfg(front: u16, port: u16) -> String {
    format!(
        "global\n\
         \x20   maxconn 1000\n\
         defaults\n\
         \x20   mode http\n\
         \x20   timeout connect 2s\n\
         \x20   timeout client 1h\n\
         \x20   timeout server 1h\n\
         \x20   timeout tunnel 1h\n\
         \x20   option redispatch\n\
         \x20   retries 3\n\
         frontend shiny\n\
         \x20   bind 127.0.0.1:{front}\n\
         \x20   default_backend shinyctl_hosts\n\
         backend shinyctl_hosts\n\
         \x20   balance roundrobin\n\
         \x20   cookie SHINYCTL_HOST insert indirect nocache httponly\n\
         \x20   option httpchk GET /.shinyctl/health\n\
         \x20   default-server check inter 300ms fall 2 rise 1\n\
         \x20   server a 127.0.0.2:{port} cookie a\n\
         \x20   server b 127.0.0.3:{port} cookie b\n"
    )
}

/// HAProxy in the foreground, ended by PID when dropped.
struct Haproxy(Child);

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Every `name=value` pair the answer set, as one Cookie header.
fn cookies(r: &Response) -> String {
    r.headers
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case("set-cookie"))
        .filter_map(|(_, v)| v.split(';').next().map(|s| s.trim().to_string()))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The status of `GET /.shinyctl/health` on `addr:port`, as HAProxy's
/// check asks it.
fn health(addr: &str, port: u16) -> u16 {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect((addr, port)).expect("the app's port");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /.shinyctl/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut head = String::new();
    let _ = s.read_to_string(&mut head);
    head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0)
}

#[test]
fn two_hosts_behind_haproxy_keep_visitors_and_sessions_and_take_over_for_each_other() {
    if Command::new("haproxy").arg("-v").output().is_err() {
        panic!("haproxy is not installed: test.sh installs it (Debian's haproxy)");
    }
    let port = free_port();
    let (host_a, host_b) = (Env::new("several-a"), Env::new("several-b"));
    // Different app names only because both "hosts" share this machine's
    // copy ports (20000-29999), which the name seeds.
    for (env, name, addr, greeting) in [(&host_a, "multi-a", "127.0.0.2", "host-a"), (&host_b, "multi-b", "127.0.0.3", "host-b")] {
        let extra = format!("host: {addr}\nreplicas: 2\nwarm-replicas: 0\nenv:\n  GREETING: {greeting}\n");
        env.apply(&env.app(name, port, &extra));
        env.wait_roles(name, "1:active 2:active", Duration::from_secs(60));
    }

    let front = free_port();
    let cfg = host_a.dir.join("haproxy.cfg");
    std::fs::write(&cfg, haproxy_cfg(front, port)).unwrap();
    let _haproxy = Haproxy(
        Command::new("haproxy").arg("-db").arg("-f").arg(&cfg).stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("haproxy runs"),
    );
    let first = wait_http_ok(front, Duration::from_secs(10));

    // A visitor stays on one host and one copy, through both cookies.
    let jar = cookies(&first);
    assert!(jar.contains("SHINYCTL_HOST=") && jar.contains(&format!("lb_{port}=")), "both layers set their cookie: {jar}");
    let (host, copy) = (between(&first.body, "greeting=", ";").unwrap().to_string(), first.copy().unwrap());
    for _ in 0..10 {
        let r = get(front, "/", &[("Cookie", &jar)]).unwrap();
        assert_eq!(r.status, 200);
        assert_eq!((between(&r.body, "greeting=", ";").unwrap(), r.copy().unwrap()), (host.as_str(), copy), "the same host and copy");
    }
    // New visitors reach both hosts.
    let hosts: std::collections::BTreeSet<String> =
        (0..6).map(|_| between(&get(front, "/", &[]).unwrap().body, "greeting=", ";").unwrap().to_string()).collect();
    assert_eq!(hosts.len(), 2, "round robin over the two hosts: {hosts:?}");

    // A Shiny session (a WebSocket) carries through both layers, to the same copy.
    let session = Session::open(front, &jar);
    assert_eq!(session.copy, copy, "the session's outputs come from the visitor's copy");
    session.close();

    // The visitor's host's app is stopped: the health check sees it down,
    // and the visitor goes to the other host; started again, it is back.
    let (mine, other, mine_app, mine_addr) =
        if host == "host-a" { (&host_a, "host-b", "multi-a", "127.0.0.2") } else { (&host_b, "host-a", "multi-b", "127.0.0.3") };
    assert_eq!(health(mine_addr, port), 200, "the health path of a running app");
    mine.ok(&["stop", mine_app]);
    wait_until(Duration::from_secs(10), "the stopped app's health path to say it is down", || {
        (health(mine_addr, port) == 503).then_some(())
    });
    wait_until(Duration::from_secs(20), "HAProxy to send the visitor to the other host", || {
        let r = get(front, "/", &[("Cookie", &jar)]).ok()?;
        (r.status == 200 && between(&r.body, "greeting=", ";") == Some(other)).then_some(())
    });
    for _ in 0..10 {
        let r = get(front, "/", &[("Cookie", &jar)]).unwrap();
        assert_eq!((r.status, between(&r.body, "greeting=", ";")), (200, Some(other)), "no visitor reaches the stopped app");
    }
    mine.ok(&["start", mine_app]);
    mine.wait_roles(mine_app, "3:active 4:active", Duration::from_secs(60));
    wait_until(Duration::from_secs(20), "the started host back in HAProxy", || {
        let hosts: std::collections::BTreeSet<String> =
            (0..6).filter_map(|_| Some(between(&get(front, "/", &[]).ok()?.body, "greeting=", ";")?.to_string())).collect();
        (hosts.len() == 2).then_some(())
    });
    let first = wait_http_ok(front, Duration::from_secs(10));
    let jar = cookies(&first);
    let host = between(&first.body, "greeting=", ";").unwrap().to_string();

    // One host's copies are all deleted: new visitors, and this visitor, go
    // to the other, with no failed request.
    let (gone, stays, gone_app) = if host == "host-a" { (&host_a, "host-b", "multi-a") } else { (&host_b, "host-a", "multi-b") };
    let visitors = Loop::start(front);
    gone.ok(&["delete", gone_app, "--now"]);
    wait_until(Duration::from_secs(30), "the deleted app to be gone", || gone.copies(gone_app).is_empty().then_some(()));
    wait_until(Duration::from_secs(10), "its port to close", || {
        std::net::TcpStream::connect((if host == "host-a" { "127.0.0.2" } else { "127.0.0.3" }, port)).is_err().then_some(())
    });
    let r = get(front, "/", &[("Cookie", &jar)]).unwrap();
    assert_eq!((r.status, between(&r.body, "greeting=", ";")), (200, Some(stays)), "the visitor of the deleted host is redispatched");
    let (sent, failed) = visitors.finish();
    assert!(sent > 20, "the loop ran: {sent}");
    assert!(failed.is_empty(), "{} of {sent} requests failed: {failed:?}", failed.len());
}
