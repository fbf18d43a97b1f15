//! sleep-and-wake.txt with real R: an idle app really stops, keeps its
//! copies' numbers, ports and disks, and the first request wakes it while
//! the load balancer holds it; requests that arrive together share one wake;
//! a wake that fails is a 503, one that takes too long a 504.

use std::time::Duration;

use crate::helpers::*;

const START: Duration = Duration::from_secs(60);

/// Waits until every copy of the app is asleep, and returns the PIDs it had.
fn wait_asleep(env: &Env, app: &str, pids: &[u32]) {
    wait_until(Duration::from_secs(30), "the app to sleep", || {
        let copies = env.copies(app);
        (!copies.is_empty() && copies.iter().all(|c| c.status == "asleep" && c.pid.is_none())).then_some(())
    });
    wait_until(Duration::from_secs(15), "its processes to be gone", || pids.iter().all(|&p| !pid_alive(p)).then_some(()));
}

#[test]
fn an_idle_app_sleeps_and_the_first_request_wakes_it_in_place() {
    let env = Env::new("sleep");
    let port = env.started("nap", "idle-timeout: 2s\n", "1:active 2:warm");
    let before = env.copies("nap");
    let pids: Vec<u32> = before.iter().filter_map(|c| c.pid).collect();
    assert_eq!(between(&wait_http_ok(port, Duration::from_secs(10)).body, "scratch=", ";"), Some("empty"));

    wait_asleep(&env, "nap", &pids);
    let text = env.ok(&["status", "nap"]);
    assert!(text.contains("nap: asleep for ") && text.contains("the first request wakes it"), "{text}");
    assert!(text.contains("Memory: 0M in 0 R processes"), "all memory back to the machine: {text}");
    let row: Vec<&str> = text.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(row[5], "asleep", "{text}");

    // The port still accepts connections; the first request wakes the app.
    let r = get(port, "/", &[]).unwrap();
    assert_eq!(r.status, 200, "held while the app woke: {r:?}");
    assert!(r.copy().is_some(), "served by a copy: {r:?}");
    assert_eq!(between(&r.body, "scratch=", ";"), Some("kept"), "the copy's disk stayed through the sleep");
    env.wait_roles("nap", "1:active 2:warm", START);
    let after = env.copies("nap");
    assert_eq!(
        before.iter().map(|c| (c.copy, c.copy_port)).collect::<Vec<_>>(),
        after.iter().map(|c| (c.copy, c.copy_port)).collect::<Vec<_>>(),
        "the same copies, on the same ports"
    );
    assert!(after.iter().all(|c| !pids.contains(&c.pid.unwrap())), "new processes");
}

#[test]
fn requests_that_arrive_together_share_one_wake() {
    let env = Env::new("together");
    let port = free_port();
    env.apply(&env.app("crowd", port, "idle-timeout: 1s\nwarm-replicas: 0\n"));
    wait_asleep(&env, "crowd", &[]);
    assert_eq!(env.starts("default-crowd.log").len(), 1);

    let clients: Vec<_> = (0..8).map(|_| std::thread::spawn(move || get(port, "/", &[]).map(|r| r.status))).collect();
    for c in clients {
        assert_eq!(c.join().unwrap().unwrap(), 200);
    }
    assert_eq!(env.starts("default-crowd.log").len(), 2, "one wake started the copy once");
}

#[test]
fn a_wake_that_fails_is_a_503_and_one_that_takes_too_long_a_504() {
    let env = Env::new("badwake");
    let slow = env.dir.join("slow-R");
    std::fs::write(&slow, "#!/bin/sh\nexec sleep 600\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&slow, std::fs::Permissions::from_mode(0o755)).unwrap();
    let base = "idle-timeout: 1s\nwarm-replicas: 0\nrequest-timeout: 3s\n";
    // (app, what its redeploy while asleep adds, the answer to the waking request)
    let cases = [("fails", "env:\n  BROKEN: \"yes\"\n".to_string(), 503), ("slow", format!("r-path: {}\n", slow.display()), 504)];
    for (name, change, status) in cases {
        let port = free_port();
        let manifest = env.app(name, port, base);
        env.apply(&manifest);
        // With a 1 s idle-timeout it may sleep as soon as it is ready.
        wait_asleep(&env, name, &[]);
        std::fs::write(&manifest, format!("app-name: {name}\nport: {port}\n{base}{change}")).unwrap();
        env.apply(&manifest);
        assert!(env.copies(name).iter().all(|c| c.status == "asleep"), "a redeploy leaves it asleep");
        let r = get(port, "/", &[]).unwrap();
        assert_eq!(r.status, status, "{name}: {r:?}");
    }
}
