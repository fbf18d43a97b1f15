//! How a deploy is going, for `--wait` (README, "Deploys that tell the
//! truth"): pure, from the app's state, the roles of its ready copies and
//! the revision the deploy started.

use std::time::Duration;

use crate::sys::fmt::{duration, DurationStyle};
use crate::wire::{AppState, CopyRecord, Role, RolloutReply, RolloutState};

/// Where the deploy of `revision` stands: serving once `replicas` of its
/// copies are active (or, deployed while the app slept, once its check has
/// been ready and the copies of the version before are gone); failed once a
/// copy of it ended before it was ready (the version before still serves)
/// or another deploy replaced it; starting otherwise. `settings` is the
/// hash of how the app starts now; `roles` are the ready copies' roles.
pub fn rollout(state: &AppState, settings: &str, replicas: u32, roles: &[(u32, Role)], revision: u64, now_ms: u64) -> RolloutReply {
    let ours = |r: &CopyRecord| r.revision == revision && r.settings == settings;
    let asleep = state.asleep_since_ms.is_some();
    let before = state.copies.iter().any(|r| !ours(r) && (asleep || roles.iter().any(|(c, role)| *c == r.copy && *role == Role::Active)));
    let reply = |state, message: String| RolloutReply { state, message, before_serves: Some(before) };
    if state.revision != revision {
        return reply(RolloutState::Failed, format!("revision {revision} was replaced by revision {} before it served", state.revision));
    }
    let ready = |r: &CopyRecord| roles.iter().any(|(c, _)| *c == r.copy);
    if let Some(r) = state.copies.iter().find(|r| ours(r) && !ready(r) && (r.crashes > 0 || r.left_down.is_some())) {
        let how = r.last_exit.map(|e| e.describe()).unwrap_or_else(|| "ended".into());
        let why = r.left_down.clone().unwrap_or_else(|| format!("it {how} before it was ready"));
        return reply(RolloutState::Failed, format!("copy {} of revision {revision} failed: {why}", r.copy));
    }
    if asleep {
        // Settled once the check's process has ended too: until then the
        // app is still stopping it, not asleep on the new version.
        let checking = state.copies.iter().any(|r| r.checking || !ours(r) || r.pid.is_some());
        return if checking {
            reply(RolloutState::Starting, format!("the app is asleep; a copy of revision {revision} starts to check it"))
        } else {
            reply(RolloutState::Serving, format!("revision {revision} was ready; the app sleeps on it and wakes with it"))
        };
    }
    let active = roles.iter().filter(|(c, role)| *role == Role::Active && state.copies.iter().any(|r| r.copy == *c && ours(r))).count();
    if active >= replicas as usize && active > 0 {
        return reply(RolloutState::Serving, format!("revision {revision} serves ({active} active)"));
    }
    let starting: Vec<String> = state
        .copies
        .iter()
        .filter(|r| ours(r) && !ready(r))
        .map(|r| match r.started_ms {
            Some(t) if r.pid.is_some() => {
                format!("copy {} starting for {}", r.copy, duration(Duration::from_millis(now_ms.saturating_sub(t)), DurationStyle::Span))
            }
            _ => format!("copy {} waiting to start", r.copy),
        })
        .collect();
    let ready_n = state.copies.iter().filter(|r| ours(r) && ready(r)).count();
    // Right after the deploy, before the daemon's cycle has made its copies.
    let starting = if starting.is_empty() { "none of its copies made yet".to_string() } else { starting.join(", ") };
    reply(RolloutState::Starting, format!("revision {revision}: {ready_n} of {replicas} ready; {starting}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Exit;

    fn copy(n: u32, revision: u64) -> CopyRecord {
        CopyRecord { copy: n, revision, settings: "s".into(), pid: Some(100 + n), started_ms: Some(0), ..CopyRecord::default() }
    }

    #[test]
    fn a_deploy_serves_once_its_copies_are_active_and_the_old_ones_only_drain() {
        let st = AppState { revision: 2, copies: vec![copy(1, 1), copy(2, 2), copy(3, 2)], ..AppState::default() };
        let r = rollout(&st, "s", 1, &[(1, Role::Active)], 2, 3000);
        assert_eq!(r.state, RolloutState::Starting);
        assert!(r.message.contains("0 of 1 ready") && r.message.contains("copy 2 starting for 3s"), "{}", r.message);
        let r = rollout(&st, "s", 1, &[(2, Role::Active), (3, Role::Warm), (1, Role::Draining)], 2, 3000);
        assert_eq!(r.state, RolloutState::Serving, "{}", r.message);
    }

    #[test]
    fn a_failed_deploy_says_whether_a_version_before_serves() {
        let mut broken = copy(2, 2);
        broken.pid = None;
        broken.crashes = 1;
        let first = AppState { revision: 2, copies: vec![broken.clone()], ..AppState::default() };
        let r = rollout(&first, "s", 1, &[], 2, 0);
        assert_eq!((r.state, r.before_serves), (RolloutState::Failed, Some(false)), "nothing before it: {}", r.message);
        let over = AppState { revision: 2, copies: vec![copy(1, 1), broken], ..AppState::default() };
        let r = rollout(&over, "s", 1, &[(1, Role::Active)], 2, 0);
        assert_eq!((r.state, r.before_serves), (RolloutState::Failed, Some(true)), "{}", r.message);
        let asleep = AppState { asleep_since_ms: Some(1), ..over };
        assert_eq!(rollout(&asleep, "s", 1, &[], 2, 0).before_serves, Some(true), "the sleeping version before wakes");
    }

    #[test]
    fn a_deploy_whose_copies_are_not_made_yet_says_so() {
        let st = AppState { revision: 1, ..AppState::default() };
        let r = rollout(&st, "s", 1, &[], 1, 0);
        assert_eq!(r.state, RolloutState::Starting);
        assert_eq!(r.message, "revision 1: 0 of 1 ready; none of its copies made yet");
    }

    #[test]
    fn a_copy_that_ends_before_it_is_ready_fails_the_deploy() {
        let mut broken = copy(2, 2);
        broken.pid = None;
        broken.crashes = 1;
        broken.last_exit = Some(Exit { at_ms: 1, code: Some(1), signal: None, memory: None, start_timeout_ms: None, disk: None });
        let st = AppState { revision: 2, copies: vec![copy(1, 1), broken], ..AppState::default() };
        let r = rollout(&st, "s", 1, &[(1, Role::Active)], 2, 3000);
        assert_eq!(r.state, RolloutState::Failed);
        assert!(r.message.contains("copy 2 of revision 2 failed: it exited with status 1"), "{}", r.message);
        let r = rollout(&st, "s", 1, &[(1, Role::Active)], 1, 3000);
        assert_eq!(r.state, RolloutState::Failed, "replaced: {}", r.message);
    }

    #[test]
    fn asleep_a_deploy_serves_once_its_check_was_ready() {
        let mut check = copy(3, 2);
        check.checking = true;
        let mut old = copy(1, 1);
        old.pid = None;
        let st = AppState { revision: 2, asleep_since_ms: Some(1), copies: vec![old, check.clone()], ..AppState::default() };
        assert_eq!(rollout(&st, "s", 1, &[], 2, 0).state, RolloutState::Starting);
        check.checking = false;
        let st = AppState { revision: 2, asleep_since_ms: Some(1), copies: vec![check.clone()], ..AppState::default() };
        assert_eq!(rollout(&st, "s", 1, &[], 2, 0).state, RolloutState::Starting, "its process is still being stopped");
        check.pid = None;
        let st = AppState { revision: 2, asleep_since_ms: Some(1), copies: vec![check], ..AppState::default() };
        assert_eq!(rollout(&st, "s", 1, &[], 2, 0).state, RolloutState::Serving);
    }
}
