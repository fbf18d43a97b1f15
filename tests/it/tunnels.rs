//! Open Shiny sessions survive an upgrade of the load balancer: a WebSocket
//! opened through a load balancer of one build carries inputs and outputs
//! afterwards through the load balancer of the next, to the same R process.

use std::time::Duration;

use crate::helpers::*;
use std::path::Path;

/// Applies `manifest` (app `app` on `port`) with the `old` binary and
/// waits for `roles` and a page; returns the old daemon's and load
/// balancer's PIDs.
fn started_on(env: &Env, old: &Path, manifest: &Path, app: &str, port: u16, roles: &str) -> (u32, u32) {
    let out = env.run_binary(old, &["apply", "-f", manifest.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    env.wait_roles(app, roles, Duration::from_secs(60));
    wait_http_ok(port, Duration::from_secs(10));
    let status = env.status();
    let (daemon, proxy) = (status["daemon_pid"].as_u64().unwrap() as u32, status["proxy_pid"].as_u64().unwrap() as u32);
    assert!(cmdline(proxy).contains("old-build"), "the load balancer is the old build's");
    (daemon, proxy)
}

/// The README's upgrade line: the old daemon stopped, this build's started
/// (`serve -d`); waits until the old load balancer has been replaced and is
/// gone.
fn upgrade_daemon(env: &Env, old_daemon: u32, old_proxy: u32) {
    signal(old_daemon, 15);
    wait_gone(old_daemon, Duration::from_secs(10), "the old daemon to exit");
    env.ok(&["serve", "-d"]);
    wait_until(Duration::from_secs(60), "the old load balancer to be replaced and gone", || {
        let p = env.status()["proxy_pid"].as_u64()? as u32;
        (p != old_proxy && !pid_alive(old_proxy)).then_some(())
    });
    let new_proxy = env.status()["proxy_pid"].as_u64().unwrap() as u32;
    assert!(!cmdline(new_proxy).contains("old-build"), "the new load balancer is this build's");
}

#[test]
fn an_open_shiny_session_keeps_working_through_a_load_balancer_upgrade() {
    let env = Env::new("tunnels");
    let old = another_build(&env.dir);
    let port = free_port();
    // The test app: its echo names the R process by its start time.
    let manifest = env.app("ws", port, "warm-replicas: 0\n");
    let (old_daemon, old_proxy) = started_on(&env, &old, &manifest, "ws", port, "1:active");

    let mut session = Session::open(port, "");
    assert_ne!(session.r_start, 0, "the app names its R");
    session.still_on_its_copy(5);
    wait_until(Duration::from_secs(20), "the session counted on copy 1", || (env.copies("ws")[0].sessions == 1).then_some(()));

    // The README's line: the daemon stopped, a new one of this build started.
    upgrade_daemon(&env, old_daemon, old_proxy);

    let log = std::fs::read_to_string(env.home().join("api.log")).unwrap();
    assert!(log.contains("handed 1 open WebSocket sessions to the new load balancer"), "the old one handed it over:\n{log}");
    assert!(log.contains("adopted 1 open WebSocket sessions"), "the new one adopted it:\n{log}");

    // The same WebSocket, through the new load balancer, to the same R.
    session.still_on_its_copy(21);
    session.still_on_its_copy(50);
    wait_until(Duration::from_secs(20), "the new load balancer to count the session", || (env.copies("ws")[0].sessions == 1).then_some(()));

    // Closing it ends the session there.
    session.close();
    wait_until(Duration::from_secs(20), "the session to end", || (env.copies("ws")[0].sessions == 0).then_some(()));
}
