//! Capacity timelines (README, "Capacity"): the app grows past `replicas`
//! when the open sessions reach `scale-at` of the active copies' capacity,
//! the spare stepping in at once; it shrinks one copy at a time after
//! `scale-down-after` of low load, never below `replicas`.

use super::*;

impl Sim {
    /// replicas 1, warm 1, up to `most` active copies of 10 sessions each,
    /// growing at 80 %, shrinking after 60 s of low load; copies 1 and 2 up.
    fn growable(most: u32) -> Sim {
        let mut sim = Sim::new(1, 1);
        sim.spec.scale.max_sessions = Some(10);
        sim.spec.scale.max_replicas = most;
        sim.spec.scale.scale_down_after_ms = 60 * S;
        sim.spec.scale.idle_timeout_ms = 0;
        sim.at(0).cycle().ready(&[1, 2]).cycle();
        sim
    }

    /// The load balancer found every active copy full.
    fn full(&mut self) -> &mut Self {
        self.world.full = true;
        self
    }

    fn scaled(&self) -> Option<String> {
        self.plan.as_ref().expect("a cycle ran").scaled.clone()
    }
}

#[test]
fn the_spare_becomes_active_at_scale_at_and_a_new_spare_starts() {
    let mut sim = Sim::growable(3);
    sim.at(10).sessions(1, 7).cycle();
    assert_eq!(sim.roles(), "1:active 2:warm", "7 of 10 is under 80 %");
    assert_eq!(sim.scaled(), None);
    sim.at(11).sessions(1, 8).cycle();
    assert_eq!(sim.roles(), "1:active 2:active", "the spare is active in the same cycle");
    assert_eq!(sim.actions(), vec![Action::Start(3)], "a new spare starts behind it");
    let why = sim.scaled().expect("it says why");
    assert!(why.contains("grows from 1 to 2 active copies: 8 open sessions reached scale-at 0.8 of 10"), "{why}");
    assert_eq!(sim.state.active_wanted, Some(2));
    assert_eq!(sim.state.grew_at_ms, Some(sim.now));
    sim.at(13).ready(&[3]).cycle();
    assert_eq!(sim.roles(), "1:active 2:active 3:warm");
    assert!(sim.actions().is_empty());
}

#[test]
fn a_full_report_from_the_load_balancer_grows_at_once() {
    // scale-at 1: the sessions alone never reach it before the copy is full;
    // the load balancer's report (the visitor sent to the spare) does.
    let mut sim = Sim::growable(3);
    sim.spec.scale.scale_at = 1.0;
    sim.at(10).sessions(1, 9).cycle();
    assert_eq!(sim.roles(), "1:active 2:warm");
    sim.at(11).full().cycle();
    assert_eq!(sim.roles(), "1:active 2:active");
    assert_eq!(sim.actions(), vec![Action::Start(3)]);
    assert!(sim.scaled().unwrap().contains("every active copy was full"), "{:?}", sim.scaled());
    sim.at(12).full().cycle();
    sim.at(12).ready(&[3]).cycle();
    assert_eq!(sim.roles(), "1:active 2:active 3:active", "a second report grows again");
}

#[test]
fn a_burst_grows_to_what_holds_it_but_never_past_max_replicas() {
    let mut sim = Sim::growable(3);
    sim.at(10).sessions(1, 30).cycle();
    assert_eq!(sim.state.active_wanted, Some(3), "at the top");
    assert_eq!(sim.actions(), vec![Action::Start(3), Action::Start(4)]);
    sim.at(12).ready(&[3, 4]).cycle();
    assert_eq!(sim.roles(), "1:active 2:active 3:active 4:warm", "the spare stays a spare at the top");
    sim.at(13).sessions(2, 10).sessions(3, 10).full().cycle();
    assert_eq!(sim.state.active_wanted, Some(3));
    assert!(sim.actions().is_empty());
    assert_eq!(sim.scaled(), None);
}

#[test]
fn it_shrinks_one_copy_at_a_time_after_scale_down_after_and_never_below_replicas() {
    let mut sim = Sim::growable(3);
    sim.at(10).sessions(1, 30).cycle().ready(&[3, 4]);
    sim.at(12).cycle();
    assert_eq!(sim.roles(), "1:active 2:active 3:active 4:warm");
    sim.at(20).sessions(1, 3).cycle();
    // Low since 20 s, and the growth at 10 s is older than that.
    assert_eq!(sim.plan.as_ref().unwrap().wake_at_ms, Some(1_000_000 + 80 * S), "looked at again when it is due");
    sim.at(79).cycle();
    assert_eq!(sim.state.active_wanted, Some(3), "not before 60 s of low load");
    sim.at(80).cycle();
    assert_eq!(sim.state.active_wanted, Some(2));
    let why = sim.scaled().unwrap();
    assert!(why.contains("shrinks from 3 to 2 active copies") && why.contains("for 1m"), "{why}");
    // The removal order: the copy with the fewest sessions, the spare first.
    assert_eq!(sim.roles(), "1:active 2:active 3:warm 4:draining");
    sim.at(91).cycle();
    assert_eq!(sim.actions(), vec![Action::Stop(4)], "no session: gone after the settle");
    sim.at(139).cycle();
    assert_eq!(sim.state.active_wanted, Some(2), "the next step waits its own 60 s");
    sim.at(140).cycle();
    assert_eq!(sim.state.active_wanted, None, "back at replicas");
    assert_eq!(sim.roles(), "1:active 2:warm 3:draining");
    sim.at(1000).cycle();
    assert_eq!(sim.actions(), vec![Action::Stop(3)]);
    sim.at(1001).cycle();
    assert_eq!(sim.copies(), "1 2", "never below replicas");
    assert_eq!(sim.roles(), "1:active 2:warm");
}

#[test]
fn a_draining_copy_keeps_its_visitors() {
    let mut sim = Sim::growable(2);
    sim.at(10).sessions(1, 8).cycle().ready(&[3]);
    sim.at(11).cycle();
    assert_eq!(sim.roles(), "1:active 2:active 3:warm");
    sim.at(20).sessions(1, 0).sessions(2, 2).cycle();
    sim.at(80).cycle();
    assert_eq!(sim.state.active_wanted, None);
    // The removal order: the fewest sessions, the spare first when they
    // tie; copy 2 and its two visitors stay (their cookie keeps them on it).
    assert_eq!(sim.roles(), "1:active 2:warm 3:draining");
    sim.at(91).cycle();
    assert_eq!(sim.actions(), vec![Action::Stop(3)]);
    assert!(sim.record(2).drain_started_ms.is_none() && sim.record(2).stop_started_ms.is_none());
}

#[test]
fn a_flapping_load_does_not_grow_and_shrink_in_turn() {
    let mut sim = Sim::growable(3);
    // Up to 9 sessions and down to 2 every 30 s, for ten minutes: it grows
    // once and stays, since the load is never low for 60 s.
    let mut changes = Vec::new();
    for t in (10..600).step_by(15) {
        let n = if (t / 30) % 2 == 0 { 9 } else { 2 };
        sim.at(t).sessions(1, n).cycle();
        if t == 10 {
            sim.ready(&[3]);
        }
        changes.extend(sim.scaled());
        assert!(!sim.actions().iter().any(|a| matches!(a, Action::Stop(_))), "at {t}: {:?}", sim.actions());
    }
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert_eq!(sim.state.active_wanted, Some(2));

    // A load that hovers at the edge of growing (8 and 7 of 10) does not
    // flap either: one copy fewer would hold 7 only under 80 % of 10.
    let mut sim = Sim::growable(3);
    let mut changes = Vec::new();
    for t in (10..600).step_by(15) {
        sim.at(t).sessions(1, if t % 2 == 0 { 8 } else { 7 }).cycle();
        changes.extend(sim.scaled());
    }
    assert_eq!(changes.len(), 1, "{changes:?}");
}

#[test]
fn a_copy_that_dies_mid_growth_comes_back_and_the_app_keeps_its_size() {
    let mut sim = Sim::growable(3);
    sim.at(10).sessions(1, 8).cycle();
    assert_eq!(sim.roles(), "1:active 2:active");
    assert_eq!(sim.actions(), vec![Action::Start(3)]);
    sim.at(11).kill(1).cycle();
    assert_eq!(sim.roles(), "2:active", "copy 3 is still starting");
    assert_eq!(sim.state.active_wanted, Some(2));
    sim.at(12).ready(&[3]).cycle();
    assert_eq!(sim.roles(), "2:active 3:active", "the new copy is active at once: two are wanted");
    sim.at(13).cycle();
    assert_eq!(sim.actions(), vec![Action::Start(1)], "after its backoff");
    sim.at(15).ready(&[1]).cycle();
    assert_eq!(sim.roles(), "2:active 3:active 1:warm", "it comes back as the spare");
    assert_eq!(sim.copies(), "1 2 3");
}

#[test]
fn before_it_sleeps_the_grown_copies_go_and_it_wakes_at_replicas() {
    let mut sim = Sim::growable(3);
    sim.spec.scale.idle_timeout_ms = 30 * S;
    sim.spec.scale.scale_down_after_ms = 600 * S;
    sim.at(10).sessions(1, 8).cycle().ready(&[3]);
    sim.at(11).sessions(1, 0).cycle();
    assert_eq!(sim.roles(), "1:active 2:active 3:warm");
    sim.at(41).cycle();
    assert!(sim.state.asleep_since_ms.is_some());
    assert_eq!(sim.state.active_wanted, None);
    assert!(sim.scaled().unwrap().contains("back from 2 to 1 active copies"));
    sim.at(42).cycle();
    assert_eq!(sim.copies(), "1 2", "the grown copy is forgotten, disk and all");
    sim.at(100).cycle();
    sim.state.asleep_since_ms = None;
    sim.at(101).cycle();
    assert_eq!(sim.actions(), vec![Action::Start(1), Action::Start(2)], "it wakes at replicas");
}

#[test]
fn without_max_sessions_nothing_changes() {
    let mut sim = Sim::new(1, 1);
    sim.spec.scale.max_replicas = 4;
    sim.at(0).cycle().ready(&[1, 2]).cycle();
    sim.at(10).sessions(1, 500).full().cycle();
    assert_eq!(sim.roles(), "1:active 2:warm");
    assert_eq!(sim.state.active_wanted, None);
}

#[test]
fn status_says_how_many_copies_are_active_for_how_many_sessions_and_when_it_last_changed() {
    let mut sim = Sim::growable(6);
    sim.spec.scale.max_sessions = Some(20);
    sim.at(10).sessions(1, 20).cycle().ready(&[3]);
    sim.at(11).sessions(2, 5).cycle();
    let roles = sim.plan.as_ref().unwrap().roles.clone();
    let c = crate::reconcile::capacity::status(&sim.spec, &sim.state, &roles, |copy| sim.world.copies.get(&copy).map_or(0, |s| s.sessions));
    assert_eq!((c.active_wanted, c.active, c.sessions, c.capacity, c.max_replicas, c.grows), (2, 2, 25, Some(40), 6, 1));
    let line = crate::reconcile::capacity::note("hello", 1, &c, |ms| format!("t{}", (ms - 1_000_000) / S)).unwrap();
    assert_eq!(line, "hello: 2 active of at most 6 (sessions 25 of 40); grew at t10");
    // An app that cannot grow has no such line.
    sim.spec.scale.max_replicas = 1;
    let c = crate::reconcile::capacity::status(&sim.spec, &sim.state, &roles, |_| 0);
    assert_eq!(crate::reconcile::capacity::note("hello", 1, &c, |_| String::new()), None);
}

#[test]
fn growth_stops_at_the_memory_bound_and_status_says_so() {
    const G: u64 = 1 << 30;
    let mut sim = Sim::growable(4);
    // Room for one more copy: 3G of 4G used, a copy takes 600M.
    sim.world.memory = Some(MemoryRoom { used: 3 * G, bound: 4 * G, per_copy: 600 << 20 });
    sim.at(10).sessions(1, 30).cycle();
    assert_eq!(sim.state.active_wanted, Some(2), "one step, not the three the load asks for");
    assert_eq!(sim.actions(), vec![Action::Start(3)]);
    // The new copy is counted from its start: no room left.
    sim.world.memory = Some(MemoryRoom { used: 3 * G + (600 << 20), bound: 4 * G, per_copy: 600 << 20 });
    sim.at(11).ready(&[3]).cycle();
    sim.at(12).cycle();
    assert_eq!(sim.state.active_wanted, Some(2));
    assert!(sim.actions().is_empty());
    let why = sim.state.held_by_memory.clone().expect("status says why it does not grow");
    assert!(why.contains("does not grow past 2 active copies") && why.contains("of the 4G SHINYCTL_MAX_MEMORY allows"), "{why}");
    // Memory freed elsewhere: it grows on.
    sim.world.memory = Some(MemoryRoom { used: G, bound: 4 * G, per_copy: 600 << 20 });
    sim.at(13).cycle();
    assert_eq!(sim.state.active_wanted, Some(4), "as far as the load asks");
    assert_eq!(sim.state.held_by_memory, None);
}
