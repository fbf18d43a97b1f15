//! What the observe step and `status` look up in /proc: whether each
//! copy's process is still the one recorded, whether it owns the port it
//! serves on, what its launcher reported, its memory. On a busy machine
//! those reads take tens of milliseconds (the listening-socket tables, a
//! scan of every process to find a copy's tree), so they run before the
//! cycle or the report, with the daemon's lock released and off the async
//! runtime: neither waits for the other (faults issue: "status answers in
//! well under 100 ms ... during a redeploy").
//!
//! The facts are at most moments old when the cycle uses them. A copy they
//! do not cover (started, or moved to another port, in between) is looked
//! up on the spot, as before.

use std::cell::OnceCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::sys::procfs::{self, PortOwner, Processes};
use crate::wire::launch::report::Report;

use crate::serve::Daemon;

/// One recorded process to look up.
#[derive(Debug, Clone)]
pub struct Probe {
    /// The copy's launcher, as recorded.
    pub pid: u32,
    /// Its recorded start time; `None` for a record from before they were kept.
    pub pid_start: Option<u64>,
    /// The port the copy serves on.
    pub port: u16,
    /// Whether its port is checked (not while it moves or is being stopped).
    pub check_port: bool,
    /// The copy's scratch folder, where its launcher reports R's PID.
    pub scratch: PathBuf,
}

/// What was found of one process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Fact {
    /// The recorded process runs (same start time, not a zombie).
    alive: bool,
    /// Who listens on its port, when that was checked.
    owner: Option<PortOwner>,
    /// R's PID as the launcher's report names it, when the port was checked.
    r_pid: Option<u32>,
}

/// The facts found, by (launcher PID, port).
#[derive(Debug, Default)]
pub struct ProbeFacts(HashMap<(u32, u16), Fact>);

impl ProbeFacts {
    /// Looks every probe up. Blocking: run it with `spawn_blocking`.
    pub fn find(probes: Vec<Probe>) -> ProbeFacts {
        if probes.is_empty() {
            return ProbeFacts::default();
        }
        let listening = probes.iter().any(|p| p.check_port).then(procfs::listening_by_port).unwrap_or_default();
        let facts = probes
            .into_iter()
            .map(|p| {
                let alive = p.pid_start.is_some_and(|s| procfs::is_alive(p.pid, s));
                let checked = alive && p.check_port;
                let r_pid = checked.then(|| crate::wire::launch::report::read_report(&p.scratch, p.pid).and_then(|r| r.r_pid)).flatten();
                let owner = checked.then(|| procfs::owner_among(listening.get(&p.port).map_or(&[], Vec::as_slice), p.pid, r_pid));
                ((p.pid, p.port), Fact { alive, owner, r_pid })
            })
            .collect();
        ProbeFacts(facts)
    }

    /// Whether the recorded process `pid` (started at `start`) runs.
    pub fn alive(&self, pid: u32, port: u16, start: Option<u64>) -> bool {
        match self.0.get(&(pid, port)) {
            Some(f) => f.alive,
            None => start.is_some_and(|s| procfs::is_alive(pid, s)),
        }
    }

    /// Who listens on `port` and R's PID as the launcher's report names
    /// it, when the look-up checked the port of launcher `pid` (it does not
    /// for a copy that moves or is being stopped).
    pub fn looked_up(&self, pid: u32, port: u16) -> Option<(PortOwner, Option<u32>)> {
        let fact = self.0.get(&(pid, port))?;
        Some((fact.owner?, fact.r_pid))
    }

    /// Who listens on `port`, from the process `pid`'s point of view.
    pub fn owner(&self, pid: u32, port: u16) -> PortOwner {
        match self.0.get(&(pid, port)).and_then(|f| f.owner) {
            Some(owner) => owner,
            None => procfs::port_owned_by(port, pid),
        }
    }
}

/// What `status` shows of one recorded process.
#[derive(Debug, Clone, Default)]
pub struct ShownProcess {
    /// The copy is alive: its launcher is the recorded process, and R, when
    /// the launcher reported it, still runs (R gone, the launcher follows
    /// a moment later).
    pub alive: bool,
    /// The launcher's report: the isolation, R's PID on the host.
    pub report: Option<Report>,
    /// The resident memory of the copy's process tree, while alive.
    pub mem_bytes: Option<u64>,
    /// The CPU time of the copy's process tree, in seconds, while alive.
    pub cpu_secs: Option<f64>,
}

/// What `status` shows of each process, by (launcher PID, start time).
#[derive(Debug, Default)]
pub struct ShownCopies(HashMap<(u32, Option<u64>), ShownProcess>);

impl ShownCopies {
    /// Looks every probe up, with one scan of every process for all the
    /// copies' memory. Blocking: run it with `spawn_blocking`.
    pub fn find(probes: Vec<Probe>) -> ShownCopies {
        if probes.is_empty() {
            return ShownCopies::default();
        }
        let processes = OnceCell::from(Processes::read());
        ShownCopies(probes.into_iter().map(|p| ((p.pid, p.pid_start), shown(p.pid, p.pid_start, &p.scratch, &processes))).collect())
    }

    /// What was found of the process `pid` (started at `start`); looked up
    /// on the spot when it was not probed (a copy started since).
    pub fn get(&self, pid: u32, start: Option<u64>, scratch: &Path) -> ShownProcess {
        match self.0.get(&(pid, start)) {
            Some(s) => s.clone(),
            // Rare (a copy started since): its own scan, only if it runs.
            None => shown(pid, start, scratch, &OnceCell::new()),
        }
    }
}

/// What `status` shows of the recorded process `pid`, its tree as
/// `processes` saw it (read here, only if it runs, when not read before).
fn shown(pid: u32, start: Option<u64>, scratch: &Path, processes: &OnceCell<Processes>) -> ShownProcess {
    let launcher_alive = start.is_some_and(|s| procfs::is_alive(pid, s));
    // The launcher's report (keyed by the recorded PID) names R's PID.
    let report = if launcher_alive { crate::wire::launch::report::read_report(scratch, pid) } else { None };
    let alive = launcher_alive && report.as_ref().and_then(|r| r.r_pid).is_none_or(procfs::running);
    let (mem_bytes, cpu_secs) = if alive {
        let processes = processes.get_or_init(Processes::read);
        (processes.tree_rss_bytes(pid), processes.tree_cpu_secs(pid))
    } else {
        (None, None)
    };
    ShownProcess { alive, report, mem_bytes, cpu_secs }
}

impl Daemon {
    /// The processes the cycles of `apps` will look at.
    pub(in crate::serve) fn probes<'a>(&self, apps: impl IntoIterator<Item = &'a String>) -> Vec<Probe> {
        let mut out = Vec::new();
        for name in apps {
            let Some(app) = self.apps.get(name) else { continue };
            let spec = &app.recorded.spec;
            for rec in &app.recorded.state.copies {
                let Some(pid) = rec.pid else { continue };
                out.push(Probe {
                    pid,
                    pid_start: rec.pid_start,
                    port: rec.port,
                    check_port: rec.moving_from.is_none() && rec.stop_started_ms.is_none(),
                    scratch: self.home.scratch_dir(&spec.group, &spec.name, rec.copy),
                });
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_found_alive_and_a_gone_one_is_not() {
        let me = std::process::id();
        let start = procfs::start_ticks(me);
        let probe = |pid, pid_start| Probe { pid, pid_start, port: 1, check_port: false, scratch: PathBuf::from("/nonexistent") };
        assert!(ProbeFacts::find(vec![probe(me, start)]).alive(me, 1, start));
        assert!(!ProbeFacts::find(vec![probe(me, start.map(|s| s + 1))]).alive(me, 1, start), "another start time is another process");
        assert!(!ProbeFacts::find(vec![probe(me, None)]).alive(me, 1, None), "a record without a start time names no process for sure");
        assert!(ProbeFacts::default().alive(me, 1, start), "what was not probed is looked up on the spot");
    }

    #[test]
    fn status_sees_this_process_alive_with_its_memory_and_a_gone_one_not() {
        let me = std::process::id();
        let start = procfs::start_ticks(me);
        let scratch = PathBuf::from("/nonexistent");
        let probe = Probe { pid: me, pid_start: start, port: 1, check_port: false, scratch: scratch.clone() };
        let shown = ShownCopies::find(vec![probe]).get(me, start, &scratch);
        assert!(shown.alive && shown.mem_bytes.is_some_and(|b| b > 0) && shown.report.is_none(), "{shown:?}");
        assert!(shown.cpu_secs.is_some_and(|s| s >= 0.0), "{shown:?}");
        let gone = ShownCopies::default().get(me, start.map(|s| s + 1), &scratch);
        assert!(!gone.alive && gone.mem_bytes.is_none(), "another start time is another process: {gone:?}");
    }

    #[test]
    fn a_socket_this_process_listens_on_is_its_own() {
        let socket = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = socket.local_addr().unwrap().port();
        let me = std::process::id();
        let probe = Probe { pid: me, pid_start: procfs::start_ticks(me), port, check_port: true, scratch: PathBuf::from("/nonexistent") };
        let facts = ProbeFacts::find(vec![probe]);
        assert_eq!(facts.owner(me, port), PortOwner::Ours);
        drop(socket);
        assert_eq!(ProbeFacts::find(vec![]).owner(me, port), PortOwner::Free, "looked up on the spot when not probed");
    }
}
