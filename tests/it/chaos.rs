//! Chaos (the faults issue): under request loops from several clients and
//! open Shiny sessions, SIGKILL a copy, the daemon and the load balancer at
//! random instants, and redeploy, scale and upgrade the daemon onto another
//! build; then count what was lost and check that nothing is orphaned or
//! torn. A short run with a fixed seed is in the suite; `bench/chaos.sh`
//! runs a long one (`chaos::a_long_chaos_run`, ignored here) and prints the
//! figures for the README.
//!
//! Why this file is long: the run, its clients and its accounting are one
//! piece; each part is a function of its own below.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::helpers::*;

/// The request clients and the session clients.
const REQUEST_CLIENTS: u64 = 3;
const SESSION_CLIENTS: usize = 4;

/// The longest the suite's run goes on to see every kind of fault.
const SUITE_MAX_SECS: u64 = 120;

/// What the run does to the app, and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    KillCopy,
    KillDaemon,
    KillBalancer,
    Redeploy,
    Scale,
    Upgrade,
}

/// Every kind of fault.
const ALL: [Fault; 6] = [Fault::KillCopy, Fault::KillDaemon, Fault::KillBalancer, Fault::Redeploy, Fault::Scale, Fault::Upgrade];

/// A fault drawn at random: copy kills most often, as in a long life.
fn random_fault(rng: &mut Rng) -> Fault {
    match rng.below(20) {
        0..=7 => Fault::KillCopy,
        8..=9 => Fault::KillDaemon,
        10..=11 => Fault::KillBalancer,
        12..=14 => Fault::Redeploy,
        15..=17 => Fault::Scale,
        _ => Fault::Upgrade,
    }
}

/// A seeded xorshift: the same seed gives the same run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Something that happened, at ms since the run began (the instant of the
/// kill or the command, before its effect was waited for).
#[derive(Debug, Clone)]
struct Happened {
    at_ms: u64,
    fault: Fault,
    /// For a killed copy: its R's start time in ticks, as the app echoes it.
    r_start: Option<u64>,
}

/// What the clients saw.
#[derive(Debug, Default)]
struct Tally {
    sent: u64,
    ok: u64,
    /// Connections refused.
    refused: Vec<u64>,
    /// Other failures (reset, EOF, a cut body, an error status), at ms.
    failed: Vec<(u64, String)>,
    sessions_opened: u64,
    /// Sessions that did not open (the WebSocket or its first output), at ms.
    open_failed: Vec<(u64, String)>,
    /// Echoes answered, per session client.
    echoes: Vec<u64>,
    /// Echoes answered by another R than the one the session opened on.
    wrong_r: Vec<String>,
    /// Sessions cut: (ms, the start time in ticks of the R it was on,
    /// whether that process had ended, why it was seen to end).
    cuts: Vec<(u64, u64, bool, String)>,
}

/// The figures of a run, after the cuts and failures are explained.
#[derive(Debug)]
struct Figures {
    sent: u64,
    failed: u64,
    refused: u64,
    in_flight_at_balancer_kill: u64,
    balancer_kills: u64,
    sessions_opened: u64,
    open_failed: u64,
    echoes: Vec<u64>,
    wrong_r: Vec<String>,
    cut_by_own_copy: u64,
    cut_by_balancer_kill: u64,
    cut_otherwise: u64,
    orphans: Vec<u32>,
    torn: Vec<String>,
    faults: Vec<(Fault, usize)>,
}

/// What the run is working on, for the faults.
struct Run<'a> {
    env: &'a Env,
    app: &'a str,
    manifest: &'a Path,
    /// This build and another one (its path holds `old-build`).
    builds: [PathBuf; 2],
    /// Which of `builds` runs.
    build: usize,
    replicas: u32,
}

/// Runs chaos for at least `secs` with `seed`, and on until every kind of
/// fault has happened (failing at `max_secs` naming those that did not);
/// returns the figures.
fn run(name: &str, secs: u64, max_secs: u64, seed: u64) -> Figures {
    let env = Env::new(name);
    let builds = [PathBuf::from(bin()), another_build(&env.dir)];
    let app = unique("chaos");
    let port = free_port();
    // The test app: its session outputs name their R by its start time.
    let manifest = env.app(&app, port, "replicas: 2\nwarm-replicas: 1\ndrain-timeout: 10s\nlb-policy: least-conn\n");
    env.apply(&manifest);
    env.wait_roles(&app, "1:active 2:active 3:warm", Duration::from_secs(90));
    wait_http_ok(port, Duration::from_secs(10));

    let began = Instant::now();
    let ms = move || began.elapsed().as_millis() as u64;
    let tally = Arc::new(Mutex::new(Tally { echoes: vec![0; SESSION_CLIENTS], ..Tally::default() }));
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    for _ in 0..REQUEST_CLIENTS {
        let (tally, stop) = (tally.clone(), stop.clone());
        threads.push(std::thread::spawn(move || request_loop(port, &tally, &stop, ms)));
    }
    for client in 0..SESSION_CLIENTS {
        let (tally, stop) = (tally.clone(), stop.clone());
        threads.push(std::thread::spawn(move || session_loop(client, port, &tally, &stop, ms)));
    }

    let mut run = Run { env: &env, app: &app, manifest: &manifest, builds, build: 0, replicas: 2 };
    let mut rng = Rng(seed.max(1));
    let mut happened: Vec<Happened> = Vec::new();
    let mut first = ALL.to_vec();
    for i in (1..first.len()).rev() {
        first.swap(i, rng.below(i as u64 + 1) as usize);
    }
    loop {
        let missing: Vec<Fault> = ALL.iter().copied().filter(|k| !happened.iter().any(|h| h.fault == *k)).collect();
        let elapsed = began.elapsed();
        if elapsed >= Duration::from_secs(secs) && missing.is_empty() {
            break;
        }
        assert!(elapsed < slow(Duration::from_secs(max_secs)), "after {elapsed:?}, these kinds of fault never happened: {missing:?}");
        // A random instant, 2 to 5 s after the last fault's effect, once a
        // spare is ready again (the promise is about faults while a spare
        // exists).
        std::thread::sleep(Duration::from_millis(2000 + rng.below(3000)));
        wait_for_spare(&env, &app);
        // Every kind once first (in a seeded order), then at random.
        let fault = first.pop().unwrap_or_else(|| random_fault(&mut rng));
        let at_ms = ms();
        let r_start = run.inflict(fault, &mut rng);
        happened.push(Happened { at_ms, fault, r_start });
    }
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        let _ = t.join();
    }
    // The daemon that runs at the end is this build's, for the checks.
    if run.build != 0 {
        run.inflict(Fault::Upgrade, &mut rng);
    }
    let want = run.replicas as usize;
    wait_until(Duration::from_secs(90), "the app to settle", || {
        let copies = env.copies(&app);
        // Settled: the wanted roles ready, and no other copy listed (a
        // draining or stopping copy shows no role once it is not ready).
        (copies.iter().filter(|c| c.role == "active" && c.ready).count() == want
            && copies.iter().any(|c| c.role == "warm" && c.ready)
            && copies.iter().all(|c| c.ready && c.role != "draining"))
        .then_some(())
    });
    let tally = std::mem::take(&mut *tally.lock().unwrap());
    figures(&env, &app, tally, &happened)
}

/// Waits until the app has a ready warm copy; panics after 60 s.
fn wait_for_spare(env: &Env, app: &str) {
    wait_until(Duration::from_secs(60), "a ready spare before the next fault", || {
        env.copies(app).iter().any(|c| c.role == "warm" && c.ready).then_some(())
    });
}

impl Run<'_> {
    /// Does one fault and waits for its effect (panicking when it does not
    /// come); for a killed copy, returns its R's start time in ticks.
    fn inflict(&mut self, fault: Fault, rng: &mut Rng) -> Option<u64> {
        let (env, app) = (self.env, self.app);
        let status = env.status();
        let daemon = status["daemon_pid"].as_u64().map(|p| p as u32);
        match fault {
            Fault::KillCopy => {
                let copies = env.copies(app);
                let active: Vec<u32> = copies.iter().filter(|c| c.role == "active").filter_map(|c| c.pid).collect();
                assert!(!active.is_empty(), "KillCopy: no active copy to kill: {copies:?}");
                let pid = active[rng.below(active.len() as u64) as usize];
                let start = shinyctl::sys::procfs::start_ticks(pid).unwrap_or_else(|| panic!("KillCopy: the active copy's R {pid} runs"));
                signal(pid, 9);
                wait_gone(pid, Duration::from_secs(10), "KillCopy: the killed copy's R");
                self.wait_whole(Some(pid), "KillCopy: a copy to come back");
                return Some(start);
            }
            Fault::KillBalancer => {
                let pid = status["proxy_pid"].as_u64().unwrap_or_else(|| panic!("KillBalancer: no load balancer runs: {status}")) as u32;
                signal(pid, 9);
                wait_gone(pid, Duration::from_secs(10), "KillBalancer: the killed load balancer");
                wait_until(Duration::from_secs(30), "KillBalancer: a new load balancer", || {
                    env.status()["proxy_pid"].as_u64().filter(|&p| p as u32 != pid && pid_alive(p as u32)).map(|_| ())
                });
            }
            Fault::KillDaemon => {
                let pid = daemon.unwrap_or_else(|| panic!("KillDaemon: no daemon runs: {status}"));
                signal(pid, 9);
                wait_gone(pid, Duration::from_secs(10), "KillDaemon: the killed daemon");
                // As systemd's Restart=on-failure would.
                std::thread::sleep(Duration::from_millis(200));
                let out = env.run_binary(&self.builds[self.build], &["serve", "-d"]);
                assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
                wait_until(Duration::from_secs(30), "KillDaemon: a new daemon", || {
                    env.status()["daemon_pid"].as_u64().filter(|&p| p as u32 != pid).map(|_| ())
                });
            }
            Fault::Upgrade => {
                let pid = daemon.unwrap_or_else(|| panic!("Upgrade: no daemon runs: {status}"));
                signal(pid, 15);
                wait_gone(pid, Duration::from_secs(15), "Upgrade: the daemon told to stop");
                self.build = 1 - self.build;
                let out = env.run_binary(&self.builds[self.build], &["serve", "-d"]);
                assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
                self.wait_upgraded();
            }
            Fault::Redeploy => {
                let before = self.revision();
                env.ok(&["restart", app]);
                wait_until(Duration::from_secs(90), "Redeploy: a copy of the new revision ready", || {
                    let v = env.status();
                    let a = v["apps"].as_array()?.iter().find(|a| a["name"] == app)?.clone();
                    let new = a["revision"].as_u64()? > before;
                    let ready = a["copies"].as_array()?.iter().any(|c| c["ready"] == true && c["outdated"] == false);
                    (new && ready).then_some(())
                });
            }
            Fault::Scale => {
                self.replicas = if self.replicas == 2 { 3 } else { 2 };
                let text = std::fs::read_to_string(self.manifest).unwrap();
                let text = text.replace(&format!("replicas: {}\n", 5 - self.replicas), &format!("replicas: {}\n", self.replicas));
                std::fs::write(self.manifest, text).unwrap();
                env.apply(self.manifest);
                self.wait_whole(None, "Scale: the new count of active copies");
            }
        }
        None
    }

    /// Waits until `replicas` ready active copies and a ready spare run,
    /// none of them the process `not` (a killed copy's R).
    fn wait_whole(&self, not: Option<u32>, what: &str) {
        wait_until(Duration::from_secs(90), what, || {
            let copies = self.env.copies(self.app);
            let active = copies.iter().filter(|c| c.role == "active" && c.ready).count();
            let spare = copies.iter().any(|c| c.role == "warm" && c.ready);
            let gone = not.is_none_or(|p| copies.iter().all(|c| c.pid != Some(p)));
            (active == self.replicas as usize && spare && gone).then_some(())
        });
    }

    /// Waits until the daemon and the load balancer are of the build that
    /// runs now and no other load balancer of the home is left.
    fn wait_upgraded(&self) {
        let ours = |pid: u32| cmdline(pid).contains("old-build") == (self.build == 1);
        wait_until(Duration::from_secs(60), &format!("Upgrade: the daemon and the load balancer of build {}", self.build), || {
            let v = self.env.status();
            let (daemon, proxy) = (v["daemon_pid"].as_u64()? as u32, v["proxy_pid"].as_u64()? as u32);
            let balancers = pids_with_home(&self.env.home()).into_iter().filter(|&p| cmdline(p).ends_with(" proxy")).count();
            (ours(daemon) && ours(proxy) && balancers == 1).then_some(())
        });
    }

    /// The app's revision, from status.
    fn revision(&self) -> u64 {
        let v = self.env.status();
        v["apps"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|a| a["name"] == self.app)
            .and_then(|a| a["revision"].as_u64())
            .expect("the app's revision")
    }
}

/// One client: a new visitor every 10 ms.
fn request_loop(port: u16, tally: &Mutex<Tally>, stop: &AtomicBool, ms: impl Fn() -> u64) {
    while !stop.load(Ordering::SeqCst) {
        let at = ms();
        let result = get(port, "/", &[]);
        let mut t = tally.lock().unwrap();
        t.sent += 1;
        match result {
            Ok(r) if r.status == 200 => t.ok += 1,
            Ok(r) => t.failed.push((at, format!("status {}", r.status))),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => t.refused.push(at),
            Err(e) => t.failed.push((at, e.to_string())),
        }
        drop(t);
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// One visitor with a Shiny page open: an input every 500 ms, its output
/// expected within 10 s; a cut session is opened again, as a browser would.
/// Every open, failed open, echo and cut is counted.
fn session_loop(client: usize, port: u16, tally: &Mutex<Tally>, stop: &AtomicBool, ms: impl Fn() -> u64) {
    let mut n = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let at = ms();
        let mut session = match Session::try_open(port, "") {
            Ok(opened) => opened,
            Err(why) => {
                if !stop.load(Ordering::SeqCst) {
                    tally.lock().unwrap().open_failed.push((at, why));
                }
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
        };
        let r = session.r_start;
        tally.lock().unwrap().sessions_opened += 1;
        while !stop.load(Ordering::SeqCst) {
            n += 1;
            match session.echo(n) {
                Ok((_, from)) => {
                    let mut t = tally.lock().unwrap();
                    t.echoes[client] += 1;
                    if from != r {
                        t.wrong_r.push(format!("a session opened on the R of tick {r} was answered by the R of tick {from}"));
                    }
                }
                Err(why) => {
                    if !stop.load(Ordering::SeqCst) {
                        let at = ms();
                        // Whether its R process ended with it (one told to
                        // stop closes its sockets a moment before it exits):
                        // 2 s, scaled by SHINYCTL_TEST_SLOW.
                        let looks = (20.0 * slow_factor()) as u32;
                        let ended = (0..looks).any(|_| {
                            let gone = !started_at(r);
                            if !gone {
                                std::thread::sleep(Duration::from_millis(100));
                            }
                            gone
                        });
                        tally.lock().unwrap().cuts.push((at, r, ended, why));
                    }
                    break;
                }
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

/// True while a live process on this machine started at `ticks` (an R
/// of the app: start times are in clock ticks, so two processes may share
/// one, which only makes an ended R look alive a little longer).
fn started_at(ticks: u64) -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else { return false };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .any(|pid| shinyctl::sys::procfs::start_ticks(pid) == Some(ticks) && pid_alive(pid) && is_copy_r(pid))
}

/// Explains the failures and cuts by what happened around them, and checks
/// for orphans and torn files.
fn figures(env: &Env, app: &str, tally: Tally, happened: &[Happened]) -> Figures {
    let kills = |kind: Fault| -> Vec<u64> { happened.iter().filter(|h| h.fault == kind).map(|h| h.at_ms).collect() };
    let (balancer_kills, copy_kills) = (kills(Fault::KillBalancer), kills(Fault::KillCopy));
    // A request or session at a load balancer's SIGKILL: begun within a
    // second before its kill, or seen to fail just after.
    let near_balancer_kill = |at: u64| balancer_kills.iter().any(|&k| at + 1000 >= k && at <= k + 1500);
    let killed: BTreeSet<u64> = happened.iter().filter(|h| h.fault == Fault::KillCopy).filter_map(|h| h.r_start).collect();
    let (mut cut_by_own_copy, mut cut_by_balancer_kill, mut cut_otherwise) = (0, 0, 0);
    for (at, started, ended, why) in &tally.cuts {
        if killed.contains(started) || *ended {
            cut_by_own_copy += 1;
        } else if near_balancer_kill(*at) {
            cut_by_balancer_kill += 1;
        } else {
            eprintln!("session on the R started at tick {started} cut at {at} ms: {why}");
            cut_otherwise += 1;
        }
    }
    for h in happened {
        eprintln!("at {} ms: {:?}{}", h.at_ms, h.fault, h.r_start.map(|t| format!(" (R started at tick {t})")).unwrap_or_default());
    }
    let in_flight = tally.failed.iter().filter(|(at, _)| near_balancer_kill(*at)).count() as u64;
    for (at, why) in tally.failed.iter().filter(|(at, _)| !near_balancer_kill(*at)) {
        eprintln!("request failed at {at} ms: {why}");
    }
    // A session that did not open: at a load balancer's kill, or on a copy
    // killed while it opened (its R is not known yet).
    let near_copy_kill = |at: u64| copy_kills.iter().any(|&k| at + 1000 >= k && at <= k + 2000);
    let open_failed: Vec<&(u64, String)> =
        tally.open_failed.iter().filter(|(at, _)| !near_balancer_kill(*at) && !near_copy_kill(*at)).collect();
    for (at, why) in &open_failed {
        eprintln!("session did not open at {at} ms: {why}");
    }
    let mut faults: Vec<(Fault, usize)> = Vec::new();
    for h in happened {
        match faults.iter_mut().find(|(f, _)| *f == h.fault) {
            Some((_, n)) => *n += 1,
            None => faults.push((h.fault, 1)),
        }
    }
    Figures {
        sent: tally.sent,
        failed: tally.failed.len() as u64 - in_flight,
        refused: tally.refused.len() as u64,
        in_flight_at_balancer_kill: in_flight,
        balancer_kills: balancer_kills.len() as u64,
        sessions_opened: tally.sessions_opened,
        open_failed: open_failed.len() as u64,
        echoes: tally.echoes,
        wrong_r: tally.wrong_r,
        cut_by_own_copy,
        cut_by_balancer_kill,
        cut_otherwise,
        orphans: orphans(env, app),
        torn: torn(env, app),
        faults,
    }
}

/// Processes of this home that are neither the daemon, the load balancer,
/// a copy status names (its R, and its launcher, which the daemon records),
/// nor a descendant of one of them.
fn orphans(env: &Env, app: &str) -> Vec<u32> {
    let status = env.status();
    let copies = status["apps"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["name"] == app)
        .flat_map(|a| a["copies"].as_array().into_iter().flatten());
    let mut known: BTreeSet<u32> =
        copies.flat_map(|c| [c["pid"].as_u64(), c["launcher_pid"].as_u64()]).flatten().map(|p| p as u32).collect();
    known.extend(["daemon_pid", "proxy_pid"].iter().filter_map(|k| status[k].as_u64()).map(|p| p as u32));
    let accounted: BTreeSet<u32> = known.iter().flat_map(|&k| std::iter::once(k).chain(shinyctl::sys::procfs::descendants(k))).collect();
    pids_with_home(&env.home())
        .into_iter()
        // A shinyctl command of this test's own (status) is no orphan.
        .filter(|pid| !accounted.contains(pid) && !cmdline(*pid).contains(" status"))
        .collect()
}

/// state.json and registry.json parse, and state.json comes to name exactly
/// the processes status shows. A copy that has just ended is still in the
/// file until the next cycle records it gone (at most 5 s), so a mismatch
/// counts only if it outlasts two cycles.
fn torn(env: &Env, app: &str) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(12);
    loop {
        let torn = torn_now(env, app);
        if torn.is_empty() || Instant::now() > deadline {
            return torn;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The torn-file check at one instant.
fn torn_now(env: &Env, app: &str) -> Vec<String> {
    let mut torn = Vec::new();
    let registry = std::fs::read(env.home().join("registry.json")).unwrap_or_default();
    match serde_json::from_slice::<serde_json::Value>(&registry) {
        Ok(v) if v["apps"][app].is_object() => {}
        other => torn.push(format!("registry.json: {other:?}")),
    }
    let state_file = env.dir.join("apps").join(app).join("state.json");
    match serde_json::from_slice::<serde_json::Value>(&std::fs::read(&state_file).unwrap_or_default()) {
        Ok(v) => {
            let recorded: BTreeSet<u64> = v["copies"].as_array().into_iter().flatten().filter_map(|c| c["pid"].as_u64()).collect();
            let shown: BTreeSet<u64> = env.status()["apps"][0]["copies"]
                .as_array()
                .into_iter()
                .flatten()
                // What the daemon records is each copy's launcher.
                .filter_map(|c| c["launcher_pid"].as_u64())
                .collect();
            if recorded != shown {
                torn.push(format!("state.json names {recorded:?}, status shows {shown:?}"));
            }
        }
        Err(e) => torn.push(format!("state.json: {e}")),
    }
    torn
}

/// Prints the figures as the README shows them.
fn print(f: &Figures, secs: u64, seed: u64) {
    println!("chaos: {secs} s, seed {seed}; faults: {:?}", f.faults);
    println!(
        "requests sent {}, failed {}, refused {}, in flight at a load balancer SIGKILL {}",
        f.sent, f.failed, f.refused, f.in_flight_at_balancer_kill
    );
    println!(
        "sessions opened {} (not opened {}), echoes {:?}, cut by their own copy's end {}, by a load balancer SIGKILL {}, otherwise {}",
        f.sessions_opened, f.open_failed, f.echoes, f.cut_by_own_copy, f.cut_by_balancer_kill, f.cut_otherwise
    );
    println!("orphans {:?}, torn files {:?}", f.orphans, f.torn);
}

/// What every run must show.
fn check(f: &Figures) {
    assert_eq!(f.failed, 0, "no request fails while a spare exists: {f:?}");
    assert_eq!(f.refused, 0, "no connection is refused: {f:?}");
    assert!(
        f.in_flight_at_balancer_kill <= REQUEST_CLIENTS * f.balancer_kills,
        "at most one request per client is in flight at each load balancer kill: {f:?}"
    );
    assert!(
        f.cut_by_balancer_kill <= SESSION_CLIENTS as u64 * f.balancer_kills,
        "at most one session per client is cut at each load balancer kill: {f:?}"
    );
    assert_eq!(f.open_failed, 0, "every session opens but at a kill: {f:?}");
    assert!(f.sessions_opened >= SESSION_CLIENTS as u64, "every session client opened one: {f:?}");
    assert!(f.echoes.iter().all(|&n| n >= 10), "every session client's inputs were echoed, many times: {f:?}");
    assert!(f.wrong_r.is_empty(), "a session is answered by the R it opened on: {f:?}");
    assert_eq!(f.cut_otherwise, 0, "no session is cut but by its copy's end or a load balancer SIGKILL: {f:?}");
    assert!(f.orphans.is_empty(), "no orphan: {f:?}");
    assert!(f.torn.is_empty(), "no torn file: {f:?}");
}

/// At least 40 s, and on until every kind of fault has happened (at most
/// 120 s, scaled by SHINYCTL_TEST_SLOW).
#[test]
fn a_short_chaos_run_loses_nothing() {
    let (secs, seed) = (40, 7);
    let f = run("chaos-short", secs, SUITE_MAX_SECS, seed);
    print(&f, secs, seed);
    check(&f);
}

/// `bench/chaos.sh`: CHAOS_SECS (default 240) and CHAOS_SEED (default 1).
#[test]
#[ignore = "minutes long; bench/chaos.sh runs it"]
fn a_long_chaos_run() {
    let secs = std::env::var("CHAOS_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(240);
    let seed = std::env::var("CHAOS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    let f = run("chaos-long", secs, secs + SUITE_MAX_SECS, seed);
    print(&f, secs, seed);
    check(&f);
}
