//! Sleep timelines (README, "Sleep", and the faults issue), played
//! against [`decide`] with the same fake world as the staying-up ones.

use super::*;

impl Sim {
    fn last_request(&mut self, secs: u64) -> &mut Self {
        self.world.last_request_ms = 1_000_000 + secs * S;
        self
    }

    /// What the daemon does when a request asks for a wake.
    fn wake(&mut self) -> &mut Self {
        self.state.asleep_since_ms = None;
        self
    }
}

#[test]
fn an_idle_app_sleeps_and_wakes_in_place() {
    // README, "Sleep": asleep is really off; number, port and disk stay.
    let mut sim = Sim::new(1, 1);
    sim.at(0).cycle().ready(&[1, 2]).cycle();
    let ports: Vec<u16> = sim.state.copies.iter().map(|r| r.port).collect();
    assert_eq!(sim.plan.as_ref().unwrap().wake_at_ms, Some(1_000_000 + 300 * S), "default idle-timeout 300s");
    sim.at(299).cycle();
    assert!(sim.actions().is_empty());
    sim.at(300).cycle();
    assert_eq!(sim.state.asleep_since_ms, Some(sim.now));
    assert_eq!(sim.actions(), vec![Action::Stop(1), Action::Stop(2)]);
    assert_eq!(sim.roles(), "", "nothing takes traffic while asleep");
    sim.at(301).cycle();
    assert_eq!(sim.copies(), "1 2", "the copies are kept");
    assert!(sim.state.copies.iter().all(|r| r.pid.is_none() && r.crashes == 0 && r.last_exit.is_none()), "sleep is no crash");
    sim.at(5000).cycle();
    assert!(sim.actions().is_empty(), "asleep, nothing starts");

    sim.at(5001).wake().cycle();
    assert_eq!(sim.actions(), vec![Action::Start(1), Action::Start(2)], "the same copies wake");
    assert_eq!(sim.state.copies.iter().map(|r| r.port).collect::<Vec<_>>(), ports);
    sim.at(5002).ready(&[1, 2]).cycle();
    assert_eq!(sim.roles(), "1:active 2:warm");
    assert_eq!(sim.state.asleep_since_ms, None);
}

#[test]
fn requests_and_open_sessions_keep_an_app_awake() {
    let mut sim = Sim::new(1, 0);
    sim.at(0).cycle().ready(&[1]).cycle();
    sim.at(250).last_request(250).cycle();
    sim.at(300).cycle();
    assert_eq!(sim.state.asleep_since_ms, None, "a request 50 s ago");
    assert_eq!(sim.plan.as_ref().unwrap().wake_at_ms, Some(1_000_000 + 550 * S));
    sim.sessions(1, 1);
    sim.at(10_000).cycle();
    assert_eq!(sim.state.asleep_since_ms, None, "an open session");
    sim.sessions(1, 0);
    sim.at(10_001).cycle();
    assert!(sim.state.asleep_since_ms.is_some());
}

#[test]
fn idle_timeout_zero_never_sleeps_and_a_busy_app_doesnt_either() {
    let mut sim = Sim::new(1, 0);
    sim.spec.scale.idle_timeout_ms = 0;
    sim.at(0).cycle().ready(&[1]).cycle();
    sim.at(100_000).cycle();
    assert_eq!(sim.state.asleep_since_ms, None);

    // Mid-redeploy (an outdated copy is still there) it doesn't sleep.
    let mut sim = Sim::new(1, 0);
    sim.at(0).cycle().ready(&[1]).cycle();
    sim.at(10).restart(false).cycle();
    sim.at(100_000).cycle();
    assert_eq!(sim.state.asleep_since_ms, None);
}

#[test]
fn after_a_failed_deploy_the_version_before_sleeps_and_wakes_the_app() {
    // A deploy whose new copy crash-loops: the version before serves, and
    // the app still sleeps once idle (the restarts are not activity).
    let mut sim = Sim::new(1, 0);
    sim.spec.scale.idle_timeout_ms = 20 * S;
    sim.at(0).cycle().ready(&[1]).cycle();
    sim.at(5).restart(false).cycle();
    assert_eq!(sim.copies(), "1 2");
    sim.at(6).cycle();
    assert_eq!(sim.state.asleep_since_ms, None, "the new copy on its first start holds the sleep off");
    sim.at(7).exits(2, Some(1), None).cycle();
    assert_eq!(sim.roles(), "1:active", "the version before serves");
    sim.at(20).cycle();
    assert_eq!(sim.state.asleep_since_ms, None, "idle for 20 s only from the deploy");
    sim.at(26).cycle();
    assert!(sim.state.asleep_since_ms.is_some(), "a failed deploy does not keep the app awake");
    // Asleep, the new version is checked once, fails, and the app keeps
    // the version before to wake with.
    sim.at(27).cycle().at(28).cycle();
    let check = sim.state.copies.iter().find(|r| r.checking).map(|r| r.copy).expect("a check of the new version");
    sim.at(29).exits(check, Some(1), None).cycle();
    assert!(sim.record(check).left_down.is_some(), "{:?}", sim.record(check));
    sim.at(100).wake().cycle();
    assert_eq!(sim.actions(), vec![Action::Start(1)], "the version before wakes");
    sim.at(101).ready(&[1]).cycle();
    assert_eq!(sim.roles(), "1:active");
    sim.at(125).cycle();
    assert!(sim.state.asleep_since_ms.is_some(), "and it sleeps again once idle");
}

#[test]
fn a_redeploy_while_asleep_is_checked_by_one_copy_then_sleeps_on_the_new_version() {
    let mut sim = Sim::new(1, 1);
    sim.at(0).cycle().ready(&[1, 2]).cycle();
    sim.at(300).cycle().at(301).cycle();
    assert!(sim.state.asleep_since_ms.is_some());
    sim.restart(false).at(400).cycle();
    assert_eq!(sim.copies(), "1 2 3", "the sleeping copies are kept to wake with while copy 3 checks the new version");
    assert_eq!(sim.actions(), vec![Action::Start(3)], "one copy checks it");
    assert!(sim.record(3).checking && sim.record(3).revision == sim.state.revision);
    sim.at(402).cycle();
    assert!(sim.actions().is_empty(), "still starting: nothing else starts");
    sim.at(403).ready(&[3]).cycle();
    assert_eq!(sim.actions(), vec![Action::Stop(3)], "ready once: it goes to sleep too");
    // A copy's disk is its number's (the daemon removes a forgotten copy's
    // disk: staying_up::a_copys_own_disk_outlives_its_process_but_not_a_redeploy).
    assert_eq!(sim.copies(), "3 4", "the old copies are forgotten, the new version's wait to wake");
    assert!(!sim.record(3).checking);
    sim.at(404).kill(3).cycle();
    assert!(sim.actions().is_empty());
    assert_eq!(sim.record(3).crashes, 0, "put to sleep, not a crash");
    assert!(sim.state.copies.iter().all(|r| r.revision == sim.state.revision && r.pid.is_none()), "{:?}", sim.state.copies);
    sim.at(500).wake().cycle();
    assert_eq!(sim.actions(), vec![Action::Start(3), Action::Start(4)]);
}

#[test]
fn a_broken_version_deployed_while_asleep_never_takes_over() {
    let mut sim = Sim::new(1, 1);
    sim.at(0).cycle().ready(&[1, 2]).cycle();
    sim.at(300).cycle().at(301).cycle();
    sim.restart(false).at(400).cycle();
    assert_eq!(sim.actions(), vec![Action::Start(3)]);
    sim.at(401).kill(3).cycle();
    let why = sim.record(3).left_down.clone().expect("the failed check is left down, with why");
    assert!(why.contains("never got ready") && why.contains("keeps the version before"), "{why}");
    assert!(sim.actions().is_empty(), "not tried again while asleep");
    sim.at(1000).cycle();
    assert!(sim.actions().is_empty());
    assert_eq!(sim.copies(), "1 2 3");

    // A visitor wakes it: the version before serves.
    sim.at(1001).wake().cycle();
    assert_eq!(sim.actions(), vec![Action::Start(1), Action::Start(2)], "the version before wakes");
    sim.at(1002).ready(&[1, 2]).cycle();
    assert_eq!(sim.roles(), "1:active 2:warm");

    // The fix, deployed while awake, replaces both.
    sim.at(1003).restart(false).cycle();
    assert!(!sim.state.copies.iter().any(|r| r.copy == 3), "the failed check is forgotten");
}

#[test]
fn a_wake_during_the_check_wakes_the_version_before_at_once() {
    let mut sim = Sim::new(1, 0);
    sim.at(0).cycle().ready(&[1]).cycle();
    sim.at(300).cycle().at(301).cycle();
    sim.restart(false).at(400).cycle();
    assert_eq!(sim.actions(), vec![Action::Start(2)]);
    // The request's wake does not wait for the check (Wake::settle).
    sim.at(401).wake().cycle();
    assert_eq!(sim.actions(), vec![Action::Start(1)], "the version before starts beside the check");
    sim.at(402).ready(&[1]).cycle();
    assert_eq!(sim.roles(), "1:active", "the version before serves while the new one is unproven");
    sim.at(403).ready(&[2]).cycle();
    assert_eq!(sim.roles(), "2:active 1:draining", "the new version, once ready, takes over as in any redeploy");
    assert!(!sim.record(2).checking);
}

#[test]
fn an_idle_app_with_a_crash_looping_copy_still_sleeps() {
    // faults issue: a broken idle app must not restart R forever.
    let mut sim = Sim::new(1, 1);
    sim.at(0).cycle().ready(&[1]).cycle();
    // Copy 2 never gets ready: it crashes at every start.
    let mut t = 1;
    while t < 299 {
        if sim.state.copies.iter().any(|r| r.copy == 2 && r.pid.is_some()) {
            sim.at(t).kill(2).cycle();
        } else {
            sim.at(t).cycle();
        }
        assert_eq!(sim.state.asleep_since_ms, None, "awake at {t}s: idle-timeout not reached");
        t += 3;
    }
    assert!(sim.record(2).crashes > 3, "copy 2 was crash-looping");
    sim.at(300).cycle();
    assert_eq!(sim.state.asleep_since_ms, Some(sim.now), "idle-timeout after the deploy, though copy 2 kept restarting");
    sim.at(400).cycle();
    assert!(sim.actions().is_empty(), "asleep, the broken copy is not restarted");
}

#[test]
fn a_broken_app_just_applied_stays_awake_for_its_idle_timeout() {
    // No copy is ever ready; the app must not fall asleep at its first crash.
    let mut sim = Sim::new(1, 0);
    sim.at(0).cycle();
    sim.at(2).kill(1).cycle();
    assert_eq!(sim.state.asleep_since_ms, None);
    assert_eq!(sim.plan.as_ref().unwrap().wake_at_ms, Some(1_000_000 + 4 * S), "its backoff, before its sleep");
    sim.at(299).cycle();
    assert_eq!(sim.state.asleep_since_ms, None);
    sim.at(300).cycle();
    assert!(sim.state.asleep_since_ms.is_some());
}

#[test]
fn a_copy_stuck_starting_does_not_keep_an_idle_app_awake() {
    let mut sim = Sim::new(1, 1);
    sim.at(0).cycle().ready(&[1]).cycle();
    sim.at(299).cycle();
    assert_eq!(sim.state.asleep_since_ms, None);
    sim.at(300).cycle();
    assert!(sim.state.asleep_since_ms.is_some(), "copy 2 never got ready in 300 s");
}

#[test]
fn an_app_that_woke_gets_a_whole_idle_timeout_again() {
    let mut sim = Sim::new(1, 0);
    sim.at(0).cycle().ready(&[1]).cycle();
    sim.at(300).cycle().at(301).cycle();
    assert!(sim.state.asleep_since_ms.is_some());
    assert_eq!(sim.state.awake_since_ms, None);
    sim.at(1000).wake().cycle();
    assert_eq!(sim.state.awake_since_ms, Some(sim.now));
    // The copy never gets ready (say R is slow); the app still stays up for idle-timeout.
    sim.at(1299).cycle();
    assert_eq!(sim.state.asleep_since_ms, None);
    sim.at(1300).cycle();
    assert!(sim.state.asleep_since_ms.is_some());
}

#[test]
fn a_copy_on_its_first_start_holds_the_sleep_off_until_it_is_ready() {
    // A short idle-timeout and a slow R: the app is seen whole before it sleeps.
    let mut sim = Sim::new(1, 1);
    sim.spec.scale.idle_timeout_ms = 2 * S;
    sim.at(0).cycle();
    sim.at(1).ready(&[1]).cycle();
    sim.at(4).cycle();
    assert_eq!(sim.state.asleep_since_ms, None, "copy 2 is still on its first start");
    sim.at(5).ready(&[2]).cycle();
    assert_eq!(sim.roles(), "1:active 2:warm");
    assert_eq!(sim.state.asleep_since_ms, None, "not in the cycle it became whole");
    // Idle-timeout counts from the last cycle that saw it coming up (4 s).
    assert_eq!(sim.plan.as_ref().unwrap().wake_at_ms, Some(1_000_000 + 6 * S));
    sim.at(6).cycle();
    assert!(sim.state.asleep_since_ms.is_some());
}
