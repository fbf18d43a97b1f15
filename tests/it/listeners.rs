//! Who holds the listening sockets (the faults issue, with the load
//! balancer issue's end of SO_REUSEPORT): the daemon binds each app's port
//! at apply and gives it to each load balancer, so a load balancer that
//! dies refuses no connection; a port already taken, or not permitted, is
//! refused at apply with what to do.

use std::process::Command;
use std::time::Duration;

use crate::helpers::*;

/// The failures of a request loop, split into connections refused (the
/// port was closed) and everything else (requests in flight at a kill:
/// reset, or closed before an answer).
fn split(errors: &[String]) -> (Vec<&String>, Vec<&String>) {
    errors.iter().partition(|e| e.contains("ConnectionRefused"))
}

/// SIGKILLs the load balancer under a request every 10 ms and checks that
/// no connection is refused while the daemon starts the next one; returns
/// the new load balancer's PID.
fn kill_the_load_balancer_under_load(env: &Env, port: u16) -> u32 {
    let old = env.status()["proxy_pid"].as_u64().expect("a load balancer runs") as u32;
    let requests = Loop::start(port);
    wait_until(Duration::from_secs(30), "requests flowing", || (requests.sent() > 30).then_some(()));
    signal(old, 9);
    let new = wait_until(Duration::from_secs(30), "a new load balancer", || {
        let p = env.status()["proxy_pid"].as_u64()? as u32;
        (p != old && pid_alive(p)).then_some(p)
    });
    let after = requests.sent();
    wait_until(Duration::from_secs(30), "requests through the new load balancer", || (requests.sent() > after + 200).then_some(()));
    let (sent, errors) = requests.finish();
    let (refused, in_flight) = split(&errors);
    assert!(refused.is_empty(), "no connection refused while the load balancer was dead: {refused:?} of {sent}");
    // One client, one request at a time: at most the one in flight at the kill.
    assert!(in_flight.len() <= 1, "only the request in flight at the kill may fail: {in_flight:?} of {sent}");
    new
}

/// The PIDs of the processes holding a socket listening on `port`.
fn holders(port: u16) -> Vec<u32> {
    shinyctl::sys::procfs::port_holders(port).into_iter().map(|h| h.pid).collect()
}

#[test]
fn a_sigkilled_load_balancer_refuses_no_connection_and_a_restarted_daemon_holds_the_sockets() {
    let env = Env::new("listeners-kill");
    let port = env.started("lbkill", "warm-replicas: 0\n", "1:active");
    let daemon = env.status()["daemon_pid"].as_u64().unwrap() as u32;
    assert!(holders(port).contains(&daemon), "the daemon holds the app's listening socket: {:?}", holders(port));
    // No copy inherits it.
    let copy = env.pid_of("lbkill", 1);
    assert!(!holders(port).contains(&copy), "a copy holds no public socket");
    let lb = kill_the_load_balancer_under_load(&env, port);
    assert!(holders(port).contains(&lb), "the new load balancer listens on the socket it was given");

    // The README's restart line (`pkill … && shinyctl serve -d`, the pkill
    // aimed at this test's daemon alone).
    signal(daemon, 15);
    env.ok(&["serve", "-d"]);
    wait_gone(daemon, Duration::from_secs(20), "the old daemon to exit");
    let new_daemon = env.status()["daemon_pid"].as_u64().unwrap() as u32;
    assert_ne!(new_daemon, daemon);
    assert_eq!(wait_http_ok(port, Duration::from_secs(10)).status, 200, "still serves");
    wait_until(Duration::from_secs(10), "the new daemon to hold the socket it took back", || {
        holders(port).contains(&new_daemon).then_some(())
    });
    assert_eq!(env.status()["proxy_pid"].as_u64().unwrap() as u32, lb, "the load balancer was adopted, not replaced");
    let api_log = std::fs::read_to_string(env.home().join("api.log")).unwrap();
    assert!(api_log.contains("took back 1 listening sockets from the running load balancer"), "{api_log}");
    kill_the_load_balancer_under_load(&env, port);
}

#[test]
fn a_port_another_shinyctl_home_listens_on_is_refused_naming_its_load_balancer() {
    let first = Env::new("listeners-home1");
    let port = first.started("taken", "warm-replicas: 0\n", "1:active");
    let first_lb = first.status()["proxy_pid"].as_u64().unwrap() as u32;

    let second = Env::new("listeners-home2");
    let manifest = second.app("taken", port, "warm-replicas: 0\n");
    let out = second.run(&["apply", "-f", manifest.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the second home's apply is refused");
    assert!(err.contains(&format!("port {port} is already in use")), "{err}");
    assert!(err.contains(&format!("its load balancer (pid {first_lb}, ")), "{err}");
    assert!(err.contains(&format!("another shinyctl home, SHINYCTL_HOME={}", first.home().display())), "names the other home: {err}");
    assert!(err.contains("app.yaml:2: port:"), "points at the manifest's line: {err}");
    assert!(second.status()["apps"].as_array().unwrap().is_empty(), "nothing was applied");
    // The first home's visitors are not split with anyone.
    for _ in 0..10 {
        assert_eq!(get(port, "/", &[]).unwrap().copy(), Some(1));
    }
}

#[test]
fn a_port_taken_while_the_daemon_was_down_is_a_line_under_the_table_until_it_is_free() {
    let env = Env::new("listeners-later");
    let port = env.started("later", "warm-replicas: 0\n", "1:active");
    let status = env.status();
    let (daemon, lb) = (status["daemon_pid"].as_u64().unwrap() as u32, status["proxy_pid"].as_u64().unwrap() as u32);
    signal(daemon, 15);
    wait_gone(daemon, Duration::from_secs(20), "the daemon to exit");
    signal(lb, 9);
    wait_gone(lb, Duration::from_secs(20), "the load balancer to die");
    // Nobody holds the port now: another program takes it.
    let squatter = wait_until(Duration::from_secs(10), "the port to be free", || std::net::TcpListener::bind(("0.0.0.0", port)).ok());
    env.ok(&["serve", "-d"]);
    let text = wait_until(Duration::from_secs(20), "the line under the table", || {
        let text = env.ok(&["status"]);
        text.contains(&format!("later: port {port}: not listening: another program listens on it")).then_some(text)
    });
    let app = &env.status()["apps"][0];
    assert_eq!(app["not_listening"], "another program listens on it", "{text}");
    drop(squatter);
    wait_http_ok(port, Duration::from_secs(30));
    wait_until(Duration::from_secs(10), "the line to go", || (!env.ok(&["status"]).contains("not listening")).then_some(()));
}

#[test]
fn a_port_below_the_unprivileged_start_is_refused_with_what_to_do() {
    if !needs_root("it makes a user of its own") {
        return;
    }
    let start: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_unprivileged_port_start").unwrap().trim().parse().unwrap();
    assert!(start > 80, "port 80 must be privileged on this machine (ip_unprivileged_port_start is {start})");
    // Declared first so it is removed last, once the test's processes (its
    // daemon runs as the user) have been ended.
    let user = TestUser::create(None);
    let env = Env::new("listeners-port80");
    let manifest = env.app("low", 80, "warm-replicas: 0\n");
    // The user owns the test's folder: the home, the app and its state-file.
    let chown = Command::new("chown").args(["-R", &user.name, env.dir.to_str().unwrap()]).status().unwrap();
    assert!(chown.success());
    let out = user.run(&env.home(), &["apply", "-f", manifest.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    let status = user.run(&env.home(), &["status", "--json"]);
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).expect("status --json as the user");
    let daemon = status["daemon_pid"].as_u64().unwrap() as u32;
    // The daemon that apply started runs as the user: ended with the test.
    env.track(daemon);
    let uid = std::fs::read_to_string(format!("/proc/{daemon}/status")).unwrap();
    assert!(!uid.lines().any(|l| l.starts_with("Uid:\t0")), "the daemon runs unprivileged: {uid}");
    assert!(!out.status.success(), "port 80 is refused: {err}");
    for what in
        ["port 80 is below", "net.ipv4.ip_unprivileged_port_start", "CAP_NET_BIND_SERVICE", "1024 or more", "setcap", "app.yaml:2: port:"]
    {
        assert!(err.contains(what), "the message says {what:?}: {err}");
    }
    assert!(status["apps"].as_array().unwrap().is_empty(), "nothing was applied");
}

/// A socket on `[::]:port` for IPv6 only: it can be bound beside a copy
/// listening on 127.0.0.1, and counts as taking the port (127.0.0.1
/// reaches `::` where the socket is not IPv6-only).
fn squat_v6only(port: u16) -> socket2::Socket {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::IPV6, Type::STREAM, None).unwrap();
    s.set_only_v6(true).unwrap();
    s.bind(&std::net::SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, port)).into()).unwrap();
    s.listen(16).unwrap();
    s
}

#[test]
fn a_copy_whose_port_another_program_takes_moves_to_another_port() {
    let env = Env::new("listeners-move");
    let name = unique("mover");
    let port = env.started(&name, "warm-replicas: 0\n", "1:active");
    let before = env.copies(&name)[0].clone();
    let _squatter = squat_v6only(before.copy_port);
    let moved = wait_until(Duration::from_secs(60), "copy 1 to move to another port and be ready", || {
        let c = env.copies(&name).into_iter().next()?;
        (c.copy_port != before.copy_port && c.ready && c.role == "active").then_some(c)
    });
    assert_eq!(moved.crashes, 0, "a move is not a crash");
    assert_ne!(moved.pid, before.pid, "started again");
    assert_eq!(wait_http_ok(port, Duration::from_secs(10)).copy(), Some(1));
    let api_log = std::fs::read_to_string(env.home().join("api.log")).unwrap();
    assert!(api_log.contains(&format!("another program listens on copy 1's port {}", before.copy_port)), "{api_log}");
}

#[test]
fn while_the_daemon_is_down_a_dead_copys_visitors_never_reach_what_listens_on_its_old_port() {
    let env = Env::new("listeners-squat");
    let port = env.started("squat", "", "1:active 2:warm");
    let copy1 = env.copies("squat").into_iter().find(|c| c.copy == 1).unwrap();
    let first = get(port, "/", &[]).unwrap();
    assert_eq!(first.copy(), Some(1));
    let cookie = first.cookie().expect("placed on copy 1");
    // The copy's launcher leads its process group (R, as the host sees it,
    // is the status's PID).
    let launcher = env.status()["apps"][0]["copies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["copy"] == 1)
        .and_then(|c| c["launcher_pid"].as_u64())
        .expect("copy 1's launcher") as u32;
    let daemon = env.status()["daemon_pid"].as_u64().unwrap() as u32;
    signal(daemon, 15);
    wait_gone(daemon, Duration::from_secs(20), "the daemon to exit");
    signal_group(launcher, 9);
    wait_gone(copy1.pid.unwrap(), Duration::from_secs(20), "copy 1 to die");
    // Another program takes copy 1's old port and answers anything.
    let squatter = wait_until(Duration::from_secs(10), "copy 1's port to be free", || {
        std::net::TcpListener::bind(("127.0.0.1", copy1.copy_port)).ok()
    });
    squatter.set_nonblocking(true).unwrap();
    for round in 0..10 {
        let headers: Vec<(&str, &str)> = if round % 2 == 0 { vec![("Cookie", cookie.as_str())] } else { vec![] };
        let r = get(port, "/", &headers).unwrap();
        assert_eq!((r.status, r.copy()), (200, Some(2)), "round {round}: the stand-in answers: {r:?}");
        assert!(squatter.accept().is_err(), "round {round}: nothing was sent to the program on copy 1's old port");
    }
}

/// Waits until nothing listens on `host:port` (it can be bound).
fn wait_free(host: &str, port: u16, what: &str) {
    wait_until(Duration::from_secs(20), what, || std::net::TcpListener::bind((host, port)).ok().map(drop));
}

#[test]
fn a_port_changed_moved_to_another_host_or_deleted_is_closed_by_both_daemon_and_load_balancer() {
    let env = Env::new("listeners-close");
    let name = unique("closer");
    let p1 = env.started(&name, "warm-replicas: 0\n", "1:active");
    let p2 = free_port();
    let manifest = env.app(&name, p2, "warm-replicas: 0\n");
    assert!(env.apply(&manifest).contains("updated without restarting any copy"));
    wait_http_ok(p2, Duration::from_secs(10));
    wait_free("0.0.0.0", p1, "the old port to be closed");
    // The same port on another host: listened on 127.0.0.1 alone, so
    // 127.0.0.2 on that port can be bound by someone else.
    std::fs::write(&manifest, format!("app-name: {name}\nport: {p2}\nwarm-replicas: 0\nhost: 127.0.0.1\n")).unwrap();
    env.apply(&manifest);
    wait_until(Duration::from_secs(20), "the app to listen on 127.0.0.1 alone", || {
        let other = std::net::TcpListener::bind(("127.0.0.2", p2)).ok()?;
        drop(other);
        (get(p2, "/", &[]).ok()?.status == 200).then_some(())
    });
    assert!(!env.ok(&["status"]).contains("not listening"), "the move left no line behind");
    env.ok(&["delete", &name, "--now"]);
    wait_free("0.0.0.0", p2, "the deleted app's port to be closed");
    assert!(holders(p2).is_empty());
}
