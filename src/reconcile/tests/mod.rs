//! Timelines from README, "Staying up", played against [`decide`] with a fake
//! clock and a fake world: a started process becomes a record with a PID, a
//! stopped one exits, and the test says when a copy is ready or dies.

use super::*;
use crate::manifest::{LbPolicy, RestartPolicy, RouteSpec, ScaleSpec, StartSpec};
use std::path::PathBuf;

mod capacity;
mod memory;
mod sleep;

const S: u64 = 1000;

pub(super) fn spec(replicas: u32, warm: u32) -> AppSpec {
    AppSpec {
        name: "hello".into(),
        group: "default".into(),
        manifest: PathBuf::from("/srv/hello/app.yaml"),
        start: StartSpec { working_dir: PathBuf::from("/srv/hello"), entrypoint: "app.R".into(), r_path: "R".into(), ..Default::default() },
        route: RouteSpec {
            host: [0, 0, 0, 0].into(),
            port: 8765,
            lb_policy: LbPolicy::LeastConn,
            request_timeout_ms: 30 * S,
            max_connections: crate::manifest::DEFAULT_MAX_CONNECTIONS,
            trusted_proxies: Vec::new(),
        },
        scale: ScaleSpec {
            replicas,
            warm_replicas: warm,
            drain_timeout_ms: 15 * 60 * S,
            restart_policy: RestartPolicy::Always,
            idle_timeout_ms: 300 * S,
            start_timeout_ms: crate::manifest::DEFAULT_START_TIMEOUT_MS,
            max_sessions: None,
            max_replicas: replicas,
            scale_at: crate::manifest::DEFAULT_SCALE_AT,
            scale_down_after_ms: crate::manifest::DEFAULT_SCALE_DOWN_AFTER_MS,
        },
        state_file: PathBuf::from("/srv/hello/state.json"),
        keep_releases: crate::manifest::DEFAULT_KEEP_RELEASES,
        pool: true,
    }
}

/// A fake world around `decide`: it plays the act step.
struct Sim {
    spec: AppSpec,
    /// The app is being deleted (`decide`'s flag).
    deleting: bool,
    state: AppState,
    world: Observed,
    now: u64,
    plan: Option<Plan>,
}

impl Sim {
    fn new(replicas: u32, warm: u32) -> Sim {
        Sim {
            spec: spec(replicas, warm),
            deleting: false,
            state: AppState::default(),
            world: Observed::default(),
            now: 1_000_000,
            plan: None,
        }
    }

    /// Moves the clock to `t` seconds after the start.
    fn at(&mut self, secs: u64) -> &mut Self {
        self.now = 1_000_000 + secs * S;
        self
    }

    /// Moves the clock on by `ms`.
    fn after_ms(&mut self, ms: u64) -> &mut Self {
        self.now += ms;
        self
    }

    /// Runs one cycle and plays its actions: a start gives the copy a
    /// process, a stop ends it (seen on the next cycle).
    fn cycle(&mut self) -> &mut Self {
        let plan = decide(&self.spec, self.deleting, &self.state, &self.world, self.now);
        // The load balancer's "every active copy was full" is taken by one cycle.
        self.world.full = false;
        self.state = plan.state.clone();
        for action in &plan.actions {
            match *action {
                Action::Start(copy) => {
                    let rec = self.state.copies.iter_mut().find(|r| r.copy == copy).expect("started copy has a record");
                    rec.pid = Some(1000 + copy);
                    rec.started_ms = Some(self.now);
                    rec.ever_ready = false;
                    rec.left_down = None;
                    self.world
                        .copies
                        .insert(copy, ObservedCopy { process: Process::Running { ready: false }, connections: 0, sessions: 0 });
                }
                Action::Stop(copy) => {
                    let exit = Exit { at_ms: self.now, code: None, signal: Some(15), memory: None, start_timeout_ms: None, disk: None };
                    self.world.copies.insert(copy, ObservedCopy { process: Process::Exited(exit), connections: 0, sessions: 0 });
                }
            }
        }
        self.world.copies.retain(|copy, _| self.state.copies.iter().any(|r| r.copy == *copy));
        self.plan = Some(plan);
        self
    }

    fn ready(&mut self, copies: &[u32]) -> &mut Self {
        for c in copies {
            self.world.copies.get_mut(c).expect("copy runs").process = Process::Running { ready: true };
        }
        self
    }

    fn exits(&mut self, copy: u32, code: Option<i32>, signal: Option<i32>) -> &mut Self {
        let exit = Exit { at_ms: self.now, code, signal, memory: None, start_timeout_ms: None, disk: None };
        self.world.copies.get_mut(&copy).expect("copy runs").process = Process::Exited(exit);
        self
    }

    fn kill(&mut self, copy: u32) -> &mut Self {
        self.exits(copy, None, Some(9))
    }

    fn sessions(&mut self, copy: u32, n: u64) -> &mut Self {
        let seen = self.world.copies.get_mut(&copy).expect("copy runs");
        seen.connections = n;
        seen.sessions = n;
        self
    }

    /// The roles as `1:active 2:warm`.
    fn roles(&self) -> String {
        let plan = self.plan.as_ref().expect("a cycle ran");
        plan.roles.iter().map(|(c, r)| format!("{c}:{}", r.as_str())).collect::<Vec<_>>().join(" ")
    }

    fn actions(&self) -> Vec<Action> {
        self.plan.as_ref().expect("a cycle ran").actions.clone()
    }

    /// The copies the state knows, as `1 2 3`.
    fn copies(&self) -> String {
        self.state.copies.iter().map(|r| r.copy.to_string()).collect::<Vec<_>>().join(" ")
    }

    fn record(&self, copy: u32) -> &CopyRecord {
        self.state.copies.iter().find(|r| r.copy == copy).expect("copy is recorded")
    }

    fn restart(&mut self, now: bool) -> &mut Self {
        self.state.revision += 1;
        self.state.stop_now = now;
        self
    }

    fn notes(&self) -> Vec<String> {
        notes(&self.spec, &self.state, &self.world, self.now, &|c| CopyLog {
            path: format!("logs/default-hello@{c}.log"),
            last_error: None,
        })
    }
}

#[test]
fn first_apply_starts_the_active_copy_and_the_spare_together() {
    let mut sim = Sim::new(1, 1);
    sim.at(0).cycle();
    assert_eq!(sim.actions(), vec![Action::Start(1), Action::Start(2)]);
    assert_eq!(sim.roles(), "", "a starting copy has no role");
    sim.at(2).ready(&[1, 2]).cycle();
    assert_eq!(sim.roles(), "1:active 2:warm");
    assert!(sim.actions().is_empty());
}

#[test]
fn an_app_being_deleted_lets_every_copy_go_with_its_scale_spec_unchanged() {
    let mut sim = Sim::new(1, 1);
    sim.at(0).cycle().at(2).ready(&[1, 2]).cycle();
    assert_eq!(sim.roles(), "1:active 2:warm");
    sim.at(3).cycle();
    assert!(sim.actions().is_empty(), "not being deleted: nothing changes");
    sim.deleting = true;
    sim.at(4).cycle();
    assert!(sim.state.copies.iter().all(|r| r.drain_started_ms.is_some() || r.stop_started_ms.is_some()), "{:?}", sim.state.copies);
    for t in [5, 15 * 60 + 10, 15 * 60 + 11, 15 * 60 + 12] {
        sim.at(t).cycle();
    }
    assert_eq!(sim.copies(), "", "no copy is left once the app is being deleted");
    assert_eq!((sim.spec.scale.replicas, sim.spec.scale.warm_replicas), (1, 1), "the flag, not a spec made to say 0");
}

#[test]
fn oldest_replicas_copies_are_active() {
    let mut sim = Sim::new(2, 1);
    sim.at(0).cycle().ready(&[1, 2, 3]).cycle();
    assert_eq!(sim.roles(), "1:active 2:active 3:warm");
}

#[test]
fn a_copy_dies_and_the_spare_takes_over_roles_dont_swap_back() {
    // README, "Staying up": a copy that dies.
    let mut sim = Sim::new(1, 1);
    sim.at(0).cycle().ready(&[1, 2]).cycle();
    sim.at(60).kill(1).cycle();
    assert_eq!(sim.roles(), "2:active", "the spare takes over at once");
    assert!(sim.actions().is_empty(), "copy 1 waits out its backoff");
    assert_eq!(sim.plan.as_ref().unwrap().wake_at_ms, Some(sim.now + 2 * S));
    assert_eq!(sim.record(1).crashes, 1);
    sim.at(61).cycle();
    assert!(sim.actions().is_empty(), "still in backoff after 1 s");
    sim.at(62).cycle();
    assert_eq!(sim.actions(), vec![Action::Start(1)]);
    assert_eq!(sim.roles(), "2:active");
    sim.at(64).ready(&[1]).cycle();
    assert_eq!(sim.roles(), "2:active 1:warm", "the dead copy comes back as the spare");
}

#[test]
fn backoff_doubles_from_two_seconds_up_to_a_minute() {
    let waits: Vec<u64> = (1..=8).map(|n| backoff_ms(n) / S).collect();
    assert_eq!(waits, vec![2, 4, 8, 16, 32, 60, 60, 60]);

    // Played out: each crash waits twice as long as the one before.
    let mut sim = Sim::new(1, 0);
    sim.at(0).cycle();
    let mut t = 0;
    for expected in [2, 4, 8, 16, 32, 60, 60] {
        sim.at(t).exits(1, Some(1), None).cycle();
        assert!(sim.actions().is_empty());
        sim.at(t + expected - 1).cycle();
        assert!(sim.actions().is_empty(), "no restart before {expected} s");
        sim.at(t + expected).cycle();
        assert_eq!(sim.actions(), vec![Action::Start(1)], "restart after {expected} s");
        t += expected;
    }
}

#[test]
fn crash_count_clears_once_the_copy_stayed_up_a_minute() {
    let mut sim = Sim::new(1, 0);
    sim.at(0).cycle().ready(&[1]).cycle();
    sim.at(10).kill(1).cycle();
    sim.at(12).cycle().ready(&[1]).cycle();
    assert_eq!(sim.record(1).crashes, 1);
    sim.at(71).cycle();
    assert_eq!(sim.record(1).crashes, 1, "up for 59 s");
    sim.at(72).cycle();
    assert_eq!(sim.record(1).crashes, 0, "up for a minute");
}

#[test]
fn a_copy_strict_mode_refused_is_left_down_not_retried_as_a_crash() {
    let mut sim = Sim::new(1, 0);
    sim.at(0).cycle();
    sim.world.refused.insert(1, "sandbox mode strict and fences are missing: user-ns (x)".into());
    sim.at(1).exits(1, Some(crate::wire::launch::EXIT_REFUSED), None).cycle();
    sim.world.refused.clear();
    sim.at(100).cycle();
    assert!(!sim.actions().contains(&Action::Start(1)), "not started again: {:?}", sim.actions());
    let rec = sim.record(1);
    assert_eq!(rec.crashes, 0, "not a crash");
    assert_eq!(rec.left_down.as_deref(), Some("refused: sandbox mode strict and fences are missing: user-ns (x)"));
    let notes = sim.notes();
    assert!(notes.iter().any(|n| n.contains("copy 1 is left down: refused: sandbox mode strict")), "{notes:?}");

    // The same status without the launcher's report is R's own: a crash.
    let mut sim = Sim::new(1, 0);
    sim.at(0).cycle();
    sim.at(1).exits(1, Some(crate::wire::launch::EXIT_REFUSED), None).cycle();
    assert_eq!((sim.record(1).crashes, sim.record(1).left_down.clone()), (1, None));
}

#[test]
fn restart_policy_decides_whether_a_copy_comes_back() {
    // (policy, exit code, signal, comes back)
    let table = [
        (RestartPolicy::Always, Some(0), None, true),
        (RestartPolicy::Always, Some(1), None, true),
        (RestartPolicy::OnFailure, Some(0), None, false),
        (RestartPolicy::OnFailure, Some(1), None, true),
        (RestartPolicy::OnFailure, None, Some(9), true),
        (RestartPolicy::Never, Some(1), None, false),
        (RestartPolicy::Never, Some(0), None, false),
    ];
    for (policy, code, signal, comes_back) in table {
        let mut sim = Sim::new(1, 0);
        sim.spec.scale.restart_policy = policy;
        sim.at(0).cycle().ready(&[1]).cycle();
        sim.at(10).exits(1, code, signal).cycle();
        sim.at(100).cycle();
        let restarted = sim.actions().contains(&Action::Start(1));
        assert_eq!(restarted, comes_back, "{policy:?} after code {code:?} signal {signal:?}");
        assert_eq!(sim.record(1).left_down.is_some(), !comes_back);
        // A clean exit left down is no crash; every other end counts.
        let crash = comes_back || code != Some(0);
        assert_eq!(sim.record(1).crashes, u32::from(crash), "{policy:?} after code {code:?}: crashes");
        assert_eq!(sim.copies(), "1", "a copy left down is not replaced");
        if !comes_back {
            let notes = sim.notes();
            assert!(notes.iter().any(|n| n.contains("copy 1 is left down") && n.contains(policy.as_str())), "{notes:?}");
        }
    }
}

#[test]
fn a_redeploy_that_drains() {
    // README, "Staying up": a redeploy that drains.
    let mut sim = Sim::new(1, 1);
    sim.at(0).cycle().ready(&[1, 2]).cycle().sessions(1, 2);
    sim.at(100).restart(false).cycle();
    assert_eq!(sim.actions(), vec![Action::Start(3)], "new copies first, spares after the switch");
    assert_eq!(sim.roles(), "1:active 2:warm", "the old copies serve meanwhile");

    sim.at(103).ready(&[3]).cycle();
    assert_eq!(sim.roles(), "3:active 1:draining", "the switch");
    assert!(sim.actions().contains(&Action::Stop(2)), "an old spare with no visitors stops right away");
    assert!(sim.actions().contains(&Action::Start(4)), "the new spare starts after the switch");
    assert!(!sim.actions().contains(&Action::Stop(1)), "copy 1 keeps its visitors");

    sim.at(105).ready(&[4]).cycle();
    assert_eq!(sim.roles(), "3:active 4:warm 1:draining");
    let notes = sim.notes();
    assert_eq!(notes, vec!["hello: copy 1 is draining with 2 sessions; it stops when they end, or in 14m58s at the latest.".to_string()]);

    sim.at(200).cycle();
    assert!(sim.actions().is_empty(), "still has sessions");
    sim.at(300).sessions(1, 0).cycle();
    assert_eq!(sim.actions(), vec![Action::Stop(1)], "the last visitor left, long after the settle");
}

#[test]
fn an_old_copy_with_no_sessions_stops_after_the_settle() {
    let mut sim = Sim::new(1, 1);
    sim.at(0).cycle().ready(&[1, 2]).cycle();
    sim.at(100).restart(false).cycle().ready(&[3]);
    sim.at(101).cycle();
    assert_eq!(sim.roles(), "3:active 1:draining");
    assert_eq!(sim.plan.as_ref().unwrap().wake_at_ms, Some(sim.now + SETTLE_MS));
    sim.at(110).cycle();
    assert!(!sim.actions().contains(&Action::Stop(1)), "kept 9 s");
    sim.at(111).cycle();
    assert!(sim.actions().contains(&Action::Stop(1)), "stopped after the 10 s settle");
    sim.at(112).cycle();
    assert_eq!(sim.copies(), "3 4", "a stopped copy is forgotten once its process is gone");
}

/// A daemon that starts during a drain (an upgrade, a `shutdown` and
/// `serve`) adopts the draining copy before it has probed it again or read
/// the load balancer's figures: the copy keeps draining, its sessions open,
/// and stops once the figures say they ended.
#[test]
fn a_draining_copy_adopted_by_a_new_daemon_keeps_its_sessions() {
    let mut sim = Sim::new(1, 0);
    sim.at(0).cycle().ready(&[1]).cycle().sessions(1, 1);
    sim.at(100).restart(false).cycle().ready(&[2]);
    sim.at(101).cycle();
    assert_eq!(sim.roles(), "2:active 1:draining");
    // The new daemon: copy 1 runs, not yet seen ready, no figures yet.
    sim.at(200);
    sim.world.traffic_unknown = true;
    for c in [1, 2] {
        sim.world.copies.insert(c, ObservedCopy { process: Process::Running { ready: false }, connections: 0, sessions: 0 });
    }
    sim.cycle();
    assert!(sim.actions().is_empty(), "nothing stops on what is not known yet: {:?}", sim.actions());
    assert!(sim.record(1).drain_started_ms.is_some() && sim.record(1).stop_started_ms.is_none());
    sim.world.traffic_unknown = false;
    sim.ready(&[1, 2]).sessions(1, 1).at(201).cycle();
    assert!(sim.actions().is_empty(), "its session is still open");
    sim.sessions(1, 0).at(202).cycle();
    assert_eq!(sim.actions(), vec![Action::Stop(1)], "stopped once its last session ended");
}

#[test]
fn a_draining_copy_stops_at_drain_timeout_even_with_sessions() {
    let mut sim = Sim::new(1, 0);
    sim.spec.scale.drain_timeout_ms = 30 * S;
    sim.at(0).cycle().ready(&[1]).cycle().sessions(1, 3);
    sim.at(10).restart(false).cycle().ready(&[2]);
    sim.at(11).cycle();
    assert_eq!(sim.roles(), "2:active 1:draining");
    assert_eq!(sim.plan.as_ref().unwrap().wake_at_ms, Some(sim.now + 30 * S));
    sim.at(40).cycle();
    assert!(sim.actions().is_empty());
    sim.at(41).cycle();
    assert_eq!(sim.actions(), vec![Action::Stop(1)]);
}

#[test]
fn restart_now_stops_the_old_copies_as_soon_as_the_new_ones_are_ready() {
    let mut sim = Sim::new(1, 1);
    sim.at(0).cycle().ready(&[1, 2]).cycle().sessions(1, 5);
    sim.at(10).restart(true).cycle();
    assert_eq!(sim.roles(), "1:active 2:warm", "not before they are ready");
    sim.at(12).ready(&[3]).cycle();
    assert_eq!(sim.actions(), vec![Action::Stop(2), Action::Start(4)], "the idle spare stops at once; the new spare starts");
    assert_eq!(sim.roles(), "3:active 1:draining", "copy 1 gets no new visitor from now");
    assert_eq!(sim.plan.as_ref().unwrap().wake_at_ms, Some(sim.now + NOW_PAUSE_MS));
    sim.after_ms(NOW_PAUSE_MS).cycle();
    assert_eq!(sim.actions(), vec![Action::Stop(1)], "its five sessions are not waited for");
    sim.at(13).cycle();
    assert!(!sim.state.stop_now, "--now ends with the redeploy");
}

#[test]
fn now_lets_a_request_in_flight_be_answered_for_a_second_at_most() {
    let mut sim = Sim::new(1, 0);
    sim.at(0).cycle().ready(&[1]).cycle().sessions(1, 2);
    sim.at(10).restart(true).cycle().ready(&[2]).cycle();
    assert_eq!(sim.roles(), "2:active 1:draining");
    // Two sessions and one plain request under way.
    sim.world.copies.get_mut(&1).unwrap().connections = 3;
    sim.after_ms(NOW_PAUSE_MS).cycle();
    assert!(sim.actions().is_empty(), "the request in flight is answered first");
    assert_eq!(sim.plan.as_ref().unwrap().wake_at_ms, Some(sim.now + NOW_PAUSE_MS), "looked at again soon");
    sim.world.copies.get_mut(&1).unwrap().connections = 2;
    sim.after_ms(NOW_PAUSE_MS).cycle();
    assert_eq!(sim.actions(), vec![Action::Stop(1)], "answered: it stops, sessions or not");

    // A request that never ends holds the stop up NOW_GRACE_MS at most.
    sim.at(20).restart(true).cycle().ready(&[3]).cycle();
    assert_eq!(sim.roles(), "3:active 2:draining");
    sim.sessions(2, 0);
    sim.world.copies.get_mut(&2).unwrap().connections = 1;
    sim.after_ms(NOW_GRACE_MS - 1).cycle();
    assert!(sim.actions().is_empty());
    assert_eq!(sim.plan.as_ref().unwrap().wake_at_ms, Some(sim.now + 1), "not past the grace");
    sim.after_ms(1).cycle();
    assert_eq!(sim.actions(), vec![Action::Stop(2)]);
}

#[test]
fn a_broken_version_never_takes_over() {
    let mut sim = Sim::new(1, 1);
    sim.at(0).cycle().ready(&[1, 2]).cycle();
    sim.at(10).restart(false).cycle();
    assert_eq!(sim.actions(), vec![Action::Start(3)]);
    sim.at(11).exits(3, Some(1), None).cycle();
    assert_eq!(sim.roles(), "1:active 2:warm", "the old ones keep serving");
    let notes = sim.notes();
    assert_eq!(
        notes,
        vec!["hello: copy 3 doesn't start: it exited with status 1 (once); the old copies keep serving. Its log: logs/default-hello@3.log"
            .to_string()]
    );
    sim.at(13).cycle();
    assert_eq!(sim.actions(), vec![Action::Start(3)], "it is tried again after its backoff");
    sim.at(14).exits(3, Some(1), None).cycle();
    assert_eq!(sim.roles(), "1:active 2:warm");
    assert_eq!(sim.record(3).crashes, 2);
}

#[test]
fn an_old_copy_that_crashes_during_a_redeploy_comes_back() {
    let mut sim = Sim::new(1, 0);
    sim.at(0).cycle().ready(&[1]).cycle();
    sim.at(10).restart(false).cycle();
    sim.at(11).kill(1).cycle();
    sim.at(13).cycle();
    assert!(sim.actions().contains(&Action::Start(1)), "the old version is all that serves");
}

#[test]
fn a_redeploy_during_another_goes_straight_to_the_newest() {
    let mut sim = Sim::new(1, 1);
    sim.at(0).cycle().ready(&[1, 2]).cycle();
    sim.at(10).restart(false).cycle();
    assert_eq!(sim.actions(), vec![Action::Start(3)]);
    sim.at(11).restart(false).cycle();
    assert_eq!(sim.actions(), vec![Action::Stop(3), Action::Start(4)]);
    sim.at(12).cycle().ready(&[4]).cycle();
    assert_eq!(sim.roles(), "4:active 1:draining");
    assert!(sim.actions().contains(&Action::Stop(2)), "the old spare stops at the switch");
    sim.at(13).cycle();
    assert_eq!(sim.copies(), "1 4 5");
}

#[test]
fn changed_settings_are_a_redeploy_like_restart() {
    let mut sim = Sim::new(1, 0);
    sim.at(0).cycle().ready(&[1]).cycle();
    sim.spec.start.env.insert("GREETING".into(), "hi".into());
    sim.at(5).cycle();
    assert_eq!(sim.actions(), vec![Action::Start(2)]);
    sim.ready(&[2]).at(6).cycle();
    assert_eq!(sim.roles(), "2:active 1:draining");
}

#[test]
fn settings_that_dont_change_how_a_copy_starts_restart_nothing() {
    let mut sim = Sim::new(1, 1);
    sim.at(0).cycle().ready(&[1, 2]).cycle();
    sim.spec.route.port = 9999;
    sim.spec.route.lb_policy = LbPolicy::First;
    sim.spec.scale.drain_timeout_ms = 5 * S;
    sim.spec.scale.restart_policy = RestartPolicy::Never;
    sim.at(5).cycle();
    assert!(sim.actions().is_empty());
    assert_eq!(sim.roles(), "1:active 2:warm");
}

#[test]
fn scaling_up_starts_copies() {
    let mut sim = Sim::new(1, 1);
    sim.at(0).cycle().ready(&[1, 2]).cycle();
    sim.spec.scale.replicas = 3;
    sim.at(5).cycle();
    assert_eq!(sim.actions(), vec![Action::Start(3), Action::Start(4)]);
    sim.ready(&[3, 4]).at(6).cycle();
    assert_eq!(sim.roles(), "1:active 2:active 3:active 4:warm");
}

#[test]
fn scaling_down_removes_in_the_documented_order() {
    // Copies 1–6 ready; then copy 3 crashes and is starting again, and copy
    // 2 dies and is down in its backoff. The copy with no process and the
    // one starting are old ones, so "newest first" or "fewest sessions"
    // alone would pick others: only the documented order picks 2, then 3.
    let mut sim = Sim::new(3, 3);
    sim.at(0).cycle().ready(&[1, 2, 3, 4, 5, 6]).cycle();
    sim.at(1).kill(3).cycle();
    sim.at(3).cycle();
    assert_eq!(sim.actions(), vec![Action::Start(3)], "copy 3 restarts after its backoff");
    sim.at(4).kill(2).cycle();
    // Copy 5 has more sessions than 4, so newest first would pick wrong.
    sim.sessions(1, 4).sessions(4, 1).sessions(5, 2).sessions(6, 1);
    assert_eq!(sim.roles(), "1:active 4:active 5:active 6:warm");

    // Remove one: the copy with no process goes first, at once.
    sim.spec.scale.warm_replicas = 2;
    sim.at(5).cycle();
    assert_eq!(sim.copies(), "1 3 4 5 6");
    // Then the one still starting, at once.
    sim.spec.scale.warm_replicas = 1;
    sim.at(5).cycle();
    assert_eq!(sim.actions(), vec![Action::Stop(3)]);
    sim.at(6).cycle();
    assert_eq!(sim.copies(), "1 4 5 6");
    // Then ready ones with the fewest sessions, warm before active on a tie:
    // 4 and 6 have one session each; 6 is warm.
    sim.spec.scale.warm_replicas = 0;
    sim.at(6).cycle();
    assert_eq!(sim.roles(), "1:active 4:active 5:active 6:draining");
    // Then copy 4 (one session) before copy 5 (two).
    sim.spec.scale.replicas = 2;
    sim.at(7).cycle();
    assert_eq!(sim.roles(), "1:active 5:active 4:draining 6:draining");
    // Copy 1 with four sessions stays.
    sim.spec.scale.replicas = 1;
    sim.at(8).cycle();
    assert_eq!(sim.roles(), "1:active 4:draining 5:draining 6:draining");
}

#[test]
fn an_apply_without_now_just_after_does_not_slow_a_hurried_copy_down() {
    let mut sim = Sim::new(1, 0);
    sim.at(0).cycle().ready(&[1]).cycle().sessions(1, 3);
    sim.at(10).restart(true).cycle().ready(&[2]).cycle();
    assert_eq!(sim.roles(), "2:active 1:draining");
    assert!(sim.notes().iter().any(|n| n.contains("copy 1 stops now (--now)")), "{:?}", sim.notes());
    // `apply` of the same manifest, without --now, within the moment.
    sim.state.stop_now = false;
    sim.after_ms(NOW_PAUSE_MS).cycle();
    assert_eq!(sim.actions(), vec![Action::Stop(1)], "its three sessions are still not waited for");
}

#[test]
fn scaling_down_with_now_stops_at_once() {
    let mut sim = Sim::new(2, 1);
    sim.at(0).cycle().ready(&[1, 2, 3]).cycle().sessions(2, 3);
    sim.spec.scale.replicas = 1;
    sim.spec.scale.warm_replicas = 0;
    sim.state.stop_now = true;
    sim.at(5).cycle();
    assert_eq!(sim.roles(), "2:active 1:draining 3:draining", "the copy with sessions stays; the others take no new visitor");
    assert!(sim.actions().is_empty());
    sim.after_ms(NOW_PAUSE_MS).cycle();
    assert_eq!(sim.actions(), vec![Action::Stop(1), Action::Stop(3)], "then stop, without waiting out a settle");
}

#[test]
fn decide_is_idempotent() {
    let mut sim = Sim::new(1, 1);
    sim.at(0).cycle().ready(&[1, 2]).cycle();
    sim.at(100).restart(false).cycle().ready(&[3]);
    let a = decide(&sim.spec, sim.deleting, &sim.state, &sim.world, sim.now);
    let b = decide(&sim.spec, sim.deleting, &sim.state, &sim.world, sim.now);
    assert_eq!(a, b);
    // And deciding on its own output changes nothing more.
    let c = decide(&sim.spec, sim.deleting, &a.state, &sim.world, sim.now);
    assert_eq!(c.state, a.state);
    assert_eq!(c.roles, a.roles);
}

#[test]
fn scaling_down_counts_sessions_not_connections() {
    // README, "Capacity": ready ones with the fewest open sessions. Copy 2 has
    // many requests in flight but no session; copy 3 one session.
    let mut sim = Sim::new(3, 0);
    sim.at(0).cycle().ready(&[1, 2, 3]).cycle();
    sim.sessions(1, 2).sessions(3, 1);
    sim.world.copies.get_mut(&2).unwrap().connections = 9;
    sim.spec.scale.replicas = 2;
    sim.at(5).cycle();
    assert_eq!(sim.roles(), "1:active 3:active 2:draining");
}

#[test]
fn new_copies_run_the_current_release_and_a_crashed_copy_keeps_its_own() {
    let mut sim = Sim::new(1, 1);
    sim.state.release = Some("r1".into());
    sim.at(0).cycle().ready(&[1, 2]).cycle();
    assert_eq!((sim.record(1).release.as_deref(), sim.record(2).release.as_deref()), (Some("r1"), Some("r1")));

    // A deploy takes r2; before the switch, old copy 1 crashes and comes back.
    sim.state.release = Some("r2".into());
    sim.at(10).restart(false).cycle();
    assert_eq!(sim.record(3).release.as_deref(), Some("r2"), "the deploy's copies run its release");
    sim.at(11).kill(1).cycle();
    sim.at(13).cycle();
    assert!(sim.actions().contains(&Action::Start(1)));
    assert_eq!(sim.record(1).release.as_deref(), Some("r1"), "a crash restart runs the recorded release");

    // Scaling up after the switch: the new copy runs the current release.
    sim.at(14).ready(&[1, 3]).cycle().ready(&[4]).cycle();
    sim.spec.scale.replicas = 2;
    sim.at(20).cycle();
    let newest = sim.state.copies.iter().map(|r| r.copy).max().unwrap();
    assert_eq!(sim.record(newest).release.as_deref(), Some("r2"));
}

#[test]
fn copies_from_before_releases_are_adopted_as_they_are() {
    let mut sim = Sim::new(1, 0);
    sim.at(0).cycle().ready(&[1]).cycle();
    assert_eq!(sim.record(1).release, None, "no release yet: it runs working-dir");
    sim.state.release = Some("r1".into());
    sim.at(5).cycle();
    assert!(sim.actions().is_empty(), "recording a release alone restarts nothing; only a deploy does");
}

#[test]
fn a_copy_whose_port_another_program_holds_moves_without_counting_a_crash() {
    let mut sim = Sim::new(1, 0);
    sim.at(0).cycle().ready(&[1]).at(1).cycle();
    sim.state.copies[0].port = 20001;
    assert_eq!(sim.roles(), "1:active");
    // Another program listens where 127.0.0.1 reaches copy 1's port.
    sim.world.copies.get_mut(&1).unwrap().process = Process::PortTaken;
    sim.at(2).cycle();
    assert_eq!(sim.actions(), vec![Action::Stop(1)], "its process is stopped");
    assert_eq!(sim.record(1).moving_from, Some(20001));
    assert!(sim.notes().iter().any(|n| n.contains("copy 1's port 20001 is taken by another program; it moves")), "{:?}", sim.notes());
    // Its exit (seen on this cycle): started again at once, on a port picked anew.
    sim.at(3).cycle();
    assert_eq!(sim.actions(), vec![Action::Start(1)]);
    let rec = sim.record(1);
    assert_eq!((rec.crashes, rec.port, rec.moving_from), (0, 0, None), "not a crash; port 0 means pick a free one");
}

#[test]
fn a_copy_not_ready_within_start_timeout_is_stopped_and_counted_as_a_crash() {
    let mut sim = Sim::new(1, 0);
    sim.at(0).cycle();
    assert_eq!(sim.actions(), vec![Action::Start(1)]);
    sim.at(59).cycle();
    assert!(sim.actions().is_empty(), "not yet");
    assert_eq!(sim.plan.as_ref().unwrap().wake_at_ms, Some(1_000_000 + 60 * S), "looked at again when it runs out");
    sim.at(60).cycle();
    assert_eq!(sim.actions(), vec![Action::Stop(1)], "the default start-timeout is 60s");
    // The fake world ends a stopped process at once (SIGTERM).
    sim.at(61).cycle();
    let rec = sim.record(1);
    assert_eq!(rec.crashes, 1, "counted as a crash");
    let exit = rec.last_exit.expect("its end");
    assert_eq!(exit.describe(), "was stopped: not ready within start-timeout 1m");
    assert!(!exit.success());
    assert!(rec.start_timed_out.is_none());
    assert!(sim.actions().is_empty(), "a backoff first");
    sim.at(62).cycle();
    assert_eq!(sim.actions(), vec![Action::Start(1)], "it comes back after the backoff");
}

#[test]
fn a_copy_that_was_ready_is_never_stopped_for_start_timeout() {
    // A restarted daemon adopts a copy that has run for an hour; its probe
    // has not answered yet in the first cycle, so it reads as not ready.
    let mut sim = Sim::new(1, 0);
    sim.spec.scale.idle_timeout_ms = 0;
    sim.at(0).cycle().ready(&[1]).cycle();
    assert!(sim.record(1).ever_ready);
    sim.world.copies.get_mut(&1).unwrap().process = Process::Running { ready: false };
    sim.at(3600).cycle();
    assert!(sim.actions().is_empty(), "not stopped: it was ready before");
    assert!(sim.record(1).start_timed_out.is_none());
    // As a record from before `ever_ready` was kept reads.
    let old: CopyRecord = serde_json::from_str(r#"{"copy":1,"pid":5,"pid_start":9,"port":20001,"revision":1,"settings":"s","started_ms":1,"crashes":0,"last_exit":null,"drain_started_ms":null,"stop_started_ms":null,"left_down":null}"#).unwrap();
    assert!(old.ever_ready, "an adopted copy of the previous build counts as ready once");
}

#[test]
fn a_stop_and_start_during_a_broken_deploy_run_the_version_that_served_beside_it() {
    // README, "Commands": `start` runs the version deployed; while that one
    // never took over (broken, or still starting), the version that served
    // at the stop serves again until it does.
    let mut sim = Sim::new(1, 0);
    sim.at(0).cycle().ready(&[1]).cycle();
    let served = sim.state.revision;
    sim.at(5).restart(false).cycle();
    sim.at(7).exits(2, Some(1), None).cycle();
    assert_eq!(sim.roles(), "1:active", "the broken deploy: the version before serves");
    sim.state.stopped_since_ms = Some(sim.now);
    sim.at(8).cycle();
    assert_eq!(sim.actions(), vec![Action::Stop(1)]);
    assert_eq!(sim.state.held_version.as_ref().map(|h| h.revision), Some(served));
    sim.at(9).kill(1).cycle();
    assert_eq!(sim.copies(), "", "stopped: nothing runs");
    sim.state.stopped_since_ms = None;
    sim.at(20).cycle();
    assert_eq!(sim.actions(), vec![Action::Start(3), Action::Start(4)]);
    assert_eq!(
        (sim.record(3).revision, sim.record(4).revision),
        (served, sim.state.revision),
        "the version that served, and the deployed one"
    );
    assert_eq!(sim.state.held_version, None, "taken");
    sim.at(22).ready(&[3]).exits(4, Some(1), None).cycle();
    assert_eq!(sim.roles(), "3:active", "the broken version still never serves");
    // A stop and start once the deployed version serves run it alone.
    sim.at(30).cycle();
    sim.at(40).ready(&[4]).cycle();
    assert_eq!(sim.roles(), "4:active 3:draining", "the deployed version took over once ready");
    sim.state.stopped_since_ms = Some(sim.now);
    sim.at(41).cycle();
    assert_eq!(sim.state.held_version, None, "nothing older served");
}

#[test]
fn a_broken_deploy_while_the_version_before_is_down_says_none_serves() {
    // The old copy crashed too: "the old copies keep serving" would be a
    // promise nobody keeps.
    let mut sim = Sim::new(1, 0);
    sim.at(0).cycle().ready(&[1]).cycle();
    sim.at(10).restart(false).cycle();
    sim.at(11).exits(2, Some(1), None).kill(1).cycle();
    let notes = sim.notes();
    assert!(
        notes.iter().any(|n| n.starts_with("hello: copy 2 doesn't start: it exited with status 1 (once); no version serves meanwhile.")),
        "{notes:?}"
    );
}
