//! A copy stopped over its memory limit (the fence issue): the observation
//! comes in as an `Exit` with `memory` set; decide counts it as a crash and
//! restarts it after the backoff, and the line under status says so.

use super::*;
use crate::wire::MemoryStop;

impl Sim {
    /// The copy was stopped for its memory: `used` bytes over `limit`.
    fn over_memory(&mut self, copy: u32, used: u64, limit: u64) -> &mut Self {
        let exit = Exit {
            at_ms: self.now,
            code: None,
            signal: Some(9),
            memory: Some(MemoryStop { used, limit }),
            start_timeout_ms: None,
            disk: None,
        };
        self.world.copies.get_mut(&copy).expect("copy runs").process = Process::Exited(exit);
        self
    }
}

const G: u64 = 1 << 30;

#[test]
fn a_copy_over_its_memory_limit_is_a_crash_restarted_after_the_backoff_and_status_says_why() {
    let mut sim = Sim::new(1, 1);
    sim.spec.start.sandbox.memory = Some(2 * G);
    sim.at(0).cycle().ready(&[1, 2]).cycle();
    sim.at(5).over_memory(2, 2 * G + G / 10, 2 * G).cycle();
    assert_eq!(sim.record(2).crashes, 1, "counted as a crash");
    assert_eq!(sim.record(2).pid, None);
    assert!(sim.actions().is_empty(), "not at once: the backoff");
    let note = sim.notes().join("\n");
    assert!(note.contains("hello: copy 2 was stopped: 2.1G, over its memory limit of 2G (once)."), "{note}");
    sim.at(7).cycle();
    assert_eq!(sim.actions(), vec![Action::Start(2)], "after the 2 s backoff");
    sim.ready(&[2]).at(9).cycle();
    assert!(sim.notes().join("\n").contains("copy 2 was stopped: 2.1G"), "still said once it is back");
    sim.at(10).over_memory(2, 3 * G, 2 * G).cycle();
    assert_eq!(sim.record(2).crashes, 2);
    assert!(sim.notes().join("\n").contains("copy 2 was stopped: 3G, over its memory limit of 2G (2 times)."));
    sim.at(13).cycle();
    assert!(sim.actions().is_empty(), "the backoff doubled to 4 s");
    sim.at(14).cycle().ready(&[2]);
    assert_eq!(sim.actions(), vec![Action::Start(2)]);
    sim.at(80).cycle();
    assert_eq!(sim.record(2).crashes, 0, "it stayed up a minute");
    assert!(sim.notes().is_empty(), "{:?}", sim.notes());
}

#[test]
fn a_copy_stopped_for_memory_is_a_failure_for_restart_policy_on_failure() {
    let mut sim = Sim::new(1, 0);
    sim.spec.scale.restart_policy = RestartPolicy::OnFailure;
    sim.at(0).cycle().ready(&[1]).cycle();
    let exit = Exit {
        at_ms: sim.now,
        code: Some(0),
        signal: None,
        memory: Some(MemoryStop { used: G, limit: G / 2 }),
        start_timeout_ms: None,
        disk: None,
    };
    assert!(!exit.success());
    sim.world.copies.get_mut(&1).unwrap().process = Process::Exited(exit);
    sim.at(1).cycle();
    assert_eq!(sim.record(1).left_down, None, "it comes back");
    sim.at(3).cycle();
    assert_eq!(sim.actions(), vec![Action::Start(1)]);
}
