//! README, "Sleep", with real R: an idle app really stops, keeps its
//! copies' numbers, ports and disks, and the first request wakes it while
//! the load balancer holds it; requests that arrive together share one wake;
//! a wake that fails is a 503, one that takes too long a 504.

use std::time::Duration;

use crate::helpers::*;

const START: Duration = Duration::from_secs(60);

/// The idle-timeout of these tests: well above an R start on a loaded
/// machine, since the idle time counts from the newest copy's start. With
/// less, a wake's copy can fall asleep again in the cycle it gets ready.
const IDLE: &str = "idle-timeout: 20s\n";

/// Waits until every copy of the app is asleep and the processes it had
/// (at least one) are gone; returns the copies as status shows them asleep.
fn wait_asleep(env: &Env, app: &str, pids: &[u32]) -> Vec<Copy> {
    assert!(!pids.is_empty(), "the app had processes to stop");
    let asleep = env.wait_asleep(app, Duration::from_secs(60));
    wait_until(Duration::from_secs(30), "its processes to be gone", || pids.iter().all(|&p| !pid_alive(p)).then_some(()));
    asleep
}

/// The PIDs of the app's copies.
fn pids(env: &Env, app: &str) -> Vec<u32> {
    env.copies(app).iter().filter_map(|c| c.pid).collect()
}

#[test]
fn an_idle_app_sleeps_and_the_first_request_wakes_it_in_place() {
    let env = Env::new("sleep");
    let nap = &unique("nap");
    let port = env.started(nap, IDLE, "1:active 2:warm");
    let pids = pids(&env, nap);
    assert_eq!(pids.len(), 2);
    assert_eq!(between(&wait_http_ok(port, Duration::from_secs(10)).body, "scratch=", ";"), Some("empty"));
    // Copy 1's /tmp, as the host sees it, holds its R's tempdir().
    let tmp = env.home().join("scratch").join(format!("default-{nap}")).join("1.tmp");
    let r_tmp = || -> Vec<String> {
        let names = std::fs::read_dir(&tmp).map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect());
        names.unwrap_or_else(|_: std::io::Error| Vec::new()).into_iter().filter(|n| n.starts_with("Rtmp")).collect()
    };
    let before = r_tmp();
    assert_eq!(before.len(), 1, "one R, one tempdir() in {}: {before:?}", tmp.display());

    let asleep = wait_asleep(&env, nap, &pids);
    assert_eq!(r_tmp(), before, "an R ended by a signal leaves its tempdir() behind");
    let text = env.ok(&["status", nap]);
    assert!(text.contains(&format!("{nap}: asleep for ")) && text.contains("the first request wakes it"), "{text}");
    assert!(text.contains("Memory: 0M in 0 R processes"), "all memory back to the machine: {text}");
    let row: Vec<&str> = text.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(row[5], "asleep", "{text}");

    // The port still accepts connections; the first request wakes the app.
    let r = get(port, "/", &[]).unwrap();
    assert_eq!(r.status, 200, "held while the app woke: {r:?}");
    assert!(r.copy().is_some(), "served by a copy: {r:?}");
    assert_eq!(between(&r.body, "scratch=", ";"), Some("kept"), "the copy's disk stayed through the sleep");
    // Where the wake spent its time, in api.log: the daemon's steps since
    // it was asked, and the load balancer's for the request it held.
    let (woke, held) = wake_lines(&env, nap);
    for step in ["cycle +", "launcher forked +", "R started +", "R listening +", "ready seen +", "table pushed +", "asked_ms="] {
        assert!(woke.contains(step), "the daemon's line names each step ({step}): {woke}");
    }
    // R's own start is told apart from shinyctl's steps around it.
    let (forked, started, listening) = (figure(&woke, "launcher forked +"), figure(&woke, "R started +"), figure(&woke, "R listening +"));
    assert!(forked <= started && started <= listening, "the launcher forked, then R started, then it listened: {woke}");
    assert!(held.contains(", answered 200 +") && held.contains("held_ms="), "{held}");
    env.wait_roles(nap, "1:active 2:warm", START);
    let after = env.copies(nap);
    let numbers_and_ports = |copies: &[Copy]| copies.iter().map(|c| (c.copy, c.copy_port)).collect::<Vec<_>>();
    assert_eq!(numbers_and_ports(&asleep), numbers_and_ports(&after), "the same copies, on the same ports");
    assert_eq!(after.len(), 2);
    assert!(after.iter().all(|c| c.pid.is_some_and(|p| !pids.contains(&p))), "new processes: {after:?}");
    // The wake's saves of state.json changed only processes, so none
    // waited for the disk (README, "Files"): its second name, the version
    // last written with fsync, is one from before, naming none of them.
    let state = env.dir.join("apps").join(nap).join("state.json");
    let pids_in = |file: &std::path::Path| -> Vec<(u64, Option<u64>)> {
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(file).unwrap()).unwrap();
        let mut pids: Vec<_> = v["copies"].as_array().unwrap().iter().map(|c| (c["copy"].as_u64().unwrap(), c["pid"].as_u64())).collect();
        pids.sort();
        pids
    };
    let recorded = pids_in(&state);
    assert!(recorded.len() == 2 && recorded.iter().all(|(_, pid)| pid.is_some()), "state.json names the new processes: {recorded:?}");
    let synced = pids_in(&state.with_file_name("state.json.synced"));
    assert!(synced.iter().all(|s| !recorded.contains(s)), "state.json.synced is from before the wake: {synced:?}, now {recorded:?}");
    // The R before's tempdir() went when the new R started (README, "The
    // fence"): a copy's /tmp is kept through sleep, and each start left one.
    let now = r_tmp();
    assert!(now.len() == 1 && now != before, "only the new R's tempdir() in {}: {now:?} (before the sleep {before:?})", tmp.display());
}

/// The wake's two lines in api.log: the daemon's `APP woke in …` and the
/// load balancer's for the request it held.
fn wake_lines(env: &Env, app: &str) -> (String, String) {
    wait_until(Duration::from_secs(10), "the wake's two lines in api.log", || {
        let log = std::fs::read_to_string(env.home().join("api.log")).ok()?;
        let line = |what: &str| log.lines().find(|l| l.contains(what)).map(str::to_string);
        Some((line(&format!("{app} woke in "))?, line(&format!("a request held for the wake of {app}: sent to copy "))?))
    })
}

/// The number after `key` in a log line: `R listening +126` → 126.
fn figure(line: &str, key: &str) -> u64 {
    let at = line.find(key).unwrap_or_else(|| panic!("{key:?} in {line}")) + key.len();
    line[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .unwrap_or_else(|_| panic!("a number after {key:?}: {line}"))
}

#[test]
fn a_wakes_held_request_goes_to_the_copy_the_moment_r_listens() {
    // Woken, this app's R listens and then keeps its loop busy for 4 s
    // before it answers anything (a `later` callback runs first thing in
    // shiny's loop): a readiness probe would be answered only after those
    // 4 s, and the held request sent after it. The visitor's request is
    // what asks R first, as with R alone.
    let env = Env::new("wakeword");
    let app = &unique("word");
    let busy = second_start("later::later(function() Sys.sleep(4), 0)");
    let port = free_port();
    env.apply(&env.app_running(&busy, app, port, &format!("{IDLE}warm-replicas: 0\n")));
    env.wait_roles(app, "1:active", START);
    wait_http_ok(port, Duration::from_secs(10));

    // The wake is asked while the copy put to sleep is still ending: its
    // launcher (the process the daemon records and waits for) is paused
    // until the ask has reached the daemon. The cycle that folds in its
    // exit must let the wake go on at once, not at the next 5 s tick.
    let launcher = env.record(app, 1).and_then(|r| r["pid"].as_u64()).expect("copy 1's launcher in state.json") as u32;
    signal(launcher, libc::SIGSTOP);
    env.wait_asleep(app, Duration::from_secs(60));
    let visitor = std::thread::spawn(move || get(port, "/", &[]));
    let asked = format!("a wake of {app} asked");
    wait_until(Duration::from_secs(10), "the daemon to have the ask", || {
        std::fs::read_to_string(env.home().join("api.log")).ok().filter(|log| log.contains(&asked)).map(|_| ())
    });
    signal(launcher, libc::SIGCONT);
    let r = visitor.join().unwrap().unwrap();
    assert_eq!(r.status, 200, "held while the app woke: {r:?}");

    let (woke, held) = wake_lines(&env, app);
    let log = std::fs::read_to_string(env.home().join("api.log")).unwrap();
    assert!(
        !log.contains("no longer answers from its own socket"),
        "a copy put to sleep, its R gone before its launcher, is no copy that lost its port:\n{log}"
    );
    let cycle = figure(&woke, "cycle +");
    assert!(cycle < slow(Duration::from_secs(1)).as_millis() as u64, "the wake's cycle came {cycle} ms after the ask:\n{woke}");
    let listening = figure(&woke, "asked_ms=") + figure(&woke, "R listening +");
    let sent = figure(&held, "held_ms=") + figure(&held, "sent to copy 1 +");
    assert!(
        sent < listening + 2_000,
        "the held request went to the copy {} ms after R listened, not when it first answered (4 s later):\n{woke}\n{held}",
        sent as i64 - listening as i64
    );
}

#[test]
fn requests_that_arrive_together_share_one_wake() {
    let env = Env::new("together");
    let crowd = &unique("crowd");
    let log = &format!("default-{crowd}.log");
    let port = env.started(crowd, &format!("{IDLE}warm-replicas: 0\n"), "1:active");
    wait_asleep(&env, crowd, &pids(&env, crowd));
    assert_eq!(env.starts(log).len(), 1);

    let clients: Vec<_> = (0..8).map(|_| std::thread::spawn(move || get(port, "/", &[]).map(|r| r.status))).collect();
    for c in clients {
        assert_eq!(c.join().unwrap().unwrap(), 200);
    }
    assert_eq!(env.starts(log).len(), 2, "one wake started the copy once");
}

#[test]
fn a_wake_that_fails_is_a_503_and_one_that_takes_too_long_a_504() {
    let env = Env::new("badwake");
    // (app, its request-timeout, what it does when woken, the answer to the
    // waking request). The failing one has all the time R may take on a
    // loaded machine to load shiny and fail.
    let cases = [("fails", "30s", "stop('broken when woken')", 503), ("slow", "3s", "Sys.sleep(600)", 504)];
    for (name, timeout, how, status) in cases {
        let port = free_port();
        let manifest = env.app_running(&second_start(how), name, port, &format!("{IDLE}warm-replicas: 0\nrequest-timeout: {timeout}\n"));
        env.apply(&manifest);
        env.wait_roles(name, "1:active", START);
        wait_http_ok(port, Duration::from_secs(10));
        wait_asleep(&env, name, &pids(&env, name));
        let r = get(port, "/", &[]).unwrap();
        assert_eq!(r.status, status, "{name}: {r:?}");
    }
}
