//! The daemon's side of a copy's limits (`crate::sys::cgroup`; the cgroups a
//! copy starts in are `serve::copies::copy_cgroups`): the memory watch every 250 ms, what an exit says about
//! memory, and removing a copy's cgroups once it is gone.

use std::time::Duration;

use crate::manifest::{AppSpec, Sandbox, SandboxMode};
use crate::sys::cgroup::hierarchy::Kind;
use crate::sys::cgroup::{self, CgroupSample, Cgroups};
use crate::sys::procfs;
use crate::wire::{AppState, CopyRecord};
use crate::wire::{LimitsReport, MemoryStop};

use crate::serve::app::{Tracked, TrackedProcess};
use crate::serve::Daemon;
use crate::serve::Shared;

/// How often the daemon looks at the memory of limited copies (and at the
/// OOM counters of their cgroups).
pub const WATCH_EVERY: Duration = Duration::from_millis(250);

/// What the watch saw of one limited copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// `sandbox.memory`.
    pub limit: u64,
    /// The copy's memory cgroup, when it is in one: the kernel keeps the
    /// limit, and its count of OOM kills says when it did.
    pub cgroup: Option<CgroupSample>,
    /// The memory of the copy's process tree, each process's proportional
    /// share (`procfs::mem_bytes`): a claimed copy's pages shared with the
    /// pool's zygote are not all its own. None once it is gone.
    pub used: Option<u64>,
}

/// The watch's decision for one copy: stop it (with what it used) or not.
/// In a memory cgroup the kernel holds the limit, and an OOM kill there
/// means the copy went over it (the rest of the copy is then stopped too);
/// outside one, its memory (proportional set size) past the limit does.
pub fn watch_verdict(s: &Sample) -> Option<MemoryStop> {
    match s.cgroup {
        // The peak cannot pass the limit in a cgroup; it reached it.
        Some(cg) if cg.oom_kills > 0 => Some(MemoryStop { used: cg.peak.max(s.limit), limit: s.limit }),
        Some(_) => None,
        None => s.used.filter(|&used| used > s.limit).map(|used| MemoryStop { used, limit: s.limit }),
    }
}

/// What `status --json` says of the limits.
pub fn limits_report(c: &Cgroups) -> LimitsReport {
    let (memory, tasks) = match &c.kind {
        Kind::V2 { .. } => ("cgroup v2", "cgroup v2"),
        Kind::V1 { memory, pids } => {
            (if memory.is_some() { "cgroup v1" } else { "watch" }, if pids.is_some() { "cgroup v1" } else { "not kept" })
        }
        Kind::None => ("watch", "not kept"),
    };
    LimitsReport { memory: memory.into(), tasks: tasks.into(), missing: c.missing.as_ref().map(|_| c.describe()) }
}

/// The fence a copy was started with: its release's deployed settings, or
/// the app's for a copy from before releases.
pub fn sandbox_of<'a>(spec: &'a AppSpec, state: &'a AppState, rec: &CopyRecord) -> &'a Sandbox {
    rec.release.as_ref().and_then(|id| crate::release::find(state, id)).map_or(&spec.start.sandbox, |r| &r.deployed.sandbox)
}

/// The line under status for an app that set `sandbox.tasks` where no
/// pids cgroup keeps it (memory is kept either way: by a cgroup or the
/// watch).
pub fn notes(cgroups: &Cgroups, spec: &AppSpec) -> Vec<String> {
    let asked = spec.start.sandbox.mode != SandboxMode::Off && spec.start.sandbox.tasks != crate::manifest::DEFAULT_TASKS;
    if !asked || cgroups.has_pids() {
        return Vec::new();
    }
    let why = cgroups.missing.as_deref().unwrap_or("no pids cgroup");
    vec![format!(
        "{}: sandbox.tasks ({}) is not kept on this machine: {why}. It needs a pids cgroup: a root daemon, or \
         shinyctl's systemd unit on cgroup v2 (`install.sh --service`; Delegate=yes, DelegateSubgroup=daemon: systemd 254+).",
        spec.name, spec.start.sandbox.tasks
    )]
}

/// The memory stop an exit of a copy carries: the watch's, or its
/// cgroup's OOM kill.
pub fn memory_stop_at_exit(
    cgroups: &Cgroups,
    tracked: &Tracked,
    name: &str,
    rec: &CopyRecord,
    pid: u32,
    limit: Option<u64>,
) -> Option<MemoryStop> {
    if let Some(stop) = tracked.process(pid).memory_stop {
        return Some(stop);
    }
    let limit = limit?;
    let cgroup = cgroups.memory_sample(&cgroup::leaf(name, rec.copy));
    watch_verdict(&Sample { limit, cgroup: Some(cgroup?), used: None })
}

/// A fenced copy whose process runs (see `Daemon::fenced_running`).
pub(in crate::serve) struct FencedCopy<'a> {
    /// Its app's name.
    pub app: &'a str,
    /// Its app's spec.
    pub spec: &'a AppSpec,
    /// Its record.
    pub rec: &'a CopyRecord,
    /// The fence it was started with (its release's).
    pub sandbox: &'a Sandbox,
    /// Its process.
    pub pid: u32,
    /// That process's start time, against a reused PID.
    pub pid_start: u64,
    /// What the daemon tracks of that process.
    pub process: TrackedProcess,
}

/// One copy the watch looks at.
struct Watched {
    app: String,
    copy: u32,
    pid: u32,
    pid_start: u64,
    limit: u64,
}

impl Daemon {
    /// The running copies with a memory limit that the watch has not
    /// stopped and nothing else is stopping.
    fn watched(&self) -> Vec<Watched> {
        self.fenced_running()
            .filter(|c| c.process.memory_stop.is_none())
            .filter_map(|c| {
                Some(Watched { app: c.app.to_string(), copy: c.rec.copy, pid: c.pid, pid_start: c.pid_start, limit: c.sandbox.memory? })
            })
            .collect()
    }

    /// Every fenced copy whose process runs and that nothing is stopping
    /// yet (neither a stop nor its exit under way), with the fence it was
    /// started with: what the memory and disk watches look at.
    pub(in crate::serve) fn fenced_running(&self) -> impl Iterator<Item = FencedCopy<'_>> {
        self.apps.iter().flat_map(|(name, app)| {
            let (spec, state, tracked) = (&app.recorded.spec, &app.recorded.state, &app.tracked);
            state.copies.iter().filter_map(move |rec| {
                let sandbox = sandbox_of(spec, state, rec);
                let (pid, pid_start) = (rec.pid?, rec.pid_start?);
                let process = tracked.process(pid);
                let busy = process.stopping || process.exit.is_some();
                (sandbox.mode != SandboxMode::Off && !busy).then_some(FencedCopy { app: name, spec, rec, sandbox, pid, pid_start, process })
            })
        })
    }

    /// Stops a copy past one of its limits, said in api.log with `why`:
    /// SIGKILL to its process group (a limit passed leaves no time for a
    /// grace period). Returns its process's record, for the stop to be kept
    /// for its exit (which the cycle counts as a crash), or none when the
    /// copy's process is no longer the one watched.
    pub(in crate::serve) fn stop_past_limit(
        &mut self,
        app: &str,
        copy: u32,
        pid: u32,
        pid_start: u64,
        why: &str,
    ) -> Option<&mut TrackedProcess> {
        let a = self.apps.get_mut(app)?;
        if !a.recorded.state.copies.iter().any(|r| r.pid == Some(pid)) || !procfs::is_alive(pid, pid_start) {
            return None;
        }
        tracing::warn!(app, copy, pid, "copy {copy} is stopped: {why}");
        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGKILL);
        // Under the lock: the exit this kill brings is folded in after the
        // stop is kept.
        Some(a.tracked.process_mut(pid))
    }

    /// Removes the copies' cgroups that no running copy uses (at each tick).
    pub(in crate::serve) fn sweep_cgroups(&self) {
        let running = self
            .apps
            .iter()
            .flat_map(|(name, a)| a.recorded.state.copies.iter().filter(|r| r.pid.is_some()).map(|r| cgroup::leaf(name, r.copy)))
            .collect();
        self.cgroups.sweep(&running);
    }

    /// Stops a copy over its memory limit: SIGKILL to its process group
    /// (growing memory leaves no time for a grace period), and the stop is
    /// kept for its exit, which the cycle counts as a crash.
    fn stop_for_memory(&mut self, w: &Watched, stop: MemoryStop) {
        if let Some(process) = self.stop_past_limit(&w.app, w.copy, w.pid, w.pid_start, &stop.describe()) {
            process.memory_stop = Some(stop);
        }
    }
}

/// The memory watch: every [`WATCH_EVERY`], the limited copies'
/// memory (their cgroup's OOM kills, or their resident memory) is read off
/// the lock and off the runtime's threads, and a copy over its limit is
/// stopped.
pub fn spawn_watch(shared: Shared, cgroups: Cgroups) {
    let cgroups = std::sync::Arc::new(cgroups);
    tokio::spawn(async move {
        let mut every = tokio::time::interval(WATCH_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            let watched = shared.lock().watched();
            if watched.is_empty() {
                continue;
            }
            let cgroups = cgroups.clone();
            let over = tokio::task::spawn_blocking(move || over_limit(&cgroups, watched)).await.unwrap_or_default();
            if !over.is_empty() {
                let mut d = shared.lock();
                for (w, stop) in &over {
                    d.stop_for_memory(w, *stop);
                }
            }
        }
    });
}

/// The watched copies over their memory limit, each with what it used.
/// Blocking (cgroup files, and one scan of /proc if a copy needs it): run
/// it with `spawn_blocking`.
fn over_limit(cgroups: &Cgroups, watched: Vec<Watched>) -> Vec<(Watched, MemoryStop)> {
    // One scan of every process for the round, and only if a copy needs it.
    let processes = std::cell::OnceCell::new();
    watched
        .into_iter()
        .filter_map(|w| {
            let leaf = cgroup::leaf(&w.app, w.copy);
            let cgroup: Option<CgroupSample> = if cgroups.holds_memory(w.pid, &leaf) { cgroups.memory_sample(&leaf) } else { None };
            let used = if cgroup.is_some() { None } else { tree_memory(processes.get_or_init(procfs::Processes::read), w.pid, w.limit) };
            watch_verdict(&Sample { limit: w.limit, cgroup, used }).map(|stop| (w, stop))
        })
        .collect()
}

/// The memory of copy `pid`'s process tree as the watch counts it: its
/// resident memory while that is within `limit` (0.02 ms a process, read
/// every [`WATCH_EVERY`]), else its proportional share, which is never
/// more (about 1 ms a process: read only for a copy that may be over);
/// and in both, its memfds, which no process's resident memory shows
/// until mapped (`procfs::Held`).
fn tree_memory(processes: &procfs::Processes, pid: u32, limit: u64) -> Option<u64> {
    let memfds = processes.tree_held(pid).memfd_bytes;
    match processes.tree_rss_bytes(pid)? + memfds {
        used if used <= limit => Some(used),
        _ => Some(processes.tree_mem_bytes(pid)? + memfds),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: u64 = 1 << 20;

    #[test]
    fn outside_a_cgroup_resident_memory_past_the_limit_stops_the_copy() {
        let s = |rss| Sample { limit: 200 * M, cgroup: None, used: rss };
        assert_eq!(watch_verdict(&s(Some(199 * M))), None);
        assert_eq!(watch_verdict(&s(Some(200 * M))), None, "at the limit is not over it");
        assert_eq!(watch_verdict(&s(Some(210 * M))), Some(MemoryStop { used: 210 * M, limit: 200 * M }));
        assert_eq!(watch_verdict(&s(None)), None, "a copy already gone is left to its exit");
    }

    #[test]
    fn in_a_cgroup_an_oom_kill_stops_the_copy_and_resident_memory_is_the_kernels_business() {
        let s = |oom_kills, peak, rss| Sample { limit: 200 * M, cgroup: Some(CgroupSample { oom_kills, peak }), used: Some(rss) };
        assert_eq!(watch_verdict(&s(0, 150 * M, 150 * M)), None);
        assert_eq!(watch_verdict(&s(0, 200 * M, 300 * M)), None, "shared pages counted twice by RSS are no reason");
        assert_eq!(watch_verdict(&s(1, 199 * M, 10 * M)), Some(MemoryStop { used: 200 * M, limit: 200 * M }));
        assert_eq!(watch_verdict(&s(2, 201 * M, 10 * M)), Some(MemoryStop { used: 201 * M, limit: 200 * M }));
    }

    #[test]
    fn the_shown_line() {
        let m = MemoryStop { used: (2.1 * (1u64 << 30) as f64) as u64, limit: 2 << 30 };
        assert_eq!(m.describe(), "2.1G, over its memory limit of 2G");
    }

    #[test]
    fn status_names_what_keeps_the_limits() {
        let none = Cgroups { kind: Kind::None, missing: Some("no cgroup".into()) };
        let r = limits_report(&none);
        assert_eq!((r.memory.as_str(), r.tasks.as_str()), ("watch", "not kept"));
        assert!(r.missing.unwrap().contains("Delegate=yes"));
        let v1 = Cgroups { kind: Kind::V1 { memory: Some("/m".into()), pids: Some("/p".into()) }, missing: None };
        let r = limits_report(&v1);
        assert_eq!((r.memory.as_str(), r.tasks.as_str(), r.missing), ("cgroup v1", "cgroup v1", None));
    }

    use crate::sys::cgroup::hierarchy::Kind;

    /// The spec of an app with `extra` manifest lines, parsed beside an
    /// app.R in a folder of its own, removed once parsed.
    fn spec(extra: &str) -> AppSpec {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("app.R"), "").unwrap();
        crate::manifest::parse(&dir.path().join("app.yaml"), &format!("app-name: hello\nport: 8080\n{extra}")).unwrap()
    }

    #[test]
    fn status_says_when_tasks_are_asked_for_and_not_kept() {
        let none = Cgroups { kind: Kind::None, missing: Some("no cgroup v1 pids controller".into()) };
        let pids = Cgroups { kind: Kind::V1 { memory: None, pids: Some("/sys/fs/cgroup/pids/shinyctl-1".into()) }, missing: None };
        let asked = spec("sandbox:\n  tasks: 100\n");
        let note = notes(&none, &asked).join("\n");
        assert!(note.starts_with("hello: sandbox.tasks (100) is not kept on this machine: no cgroup v1 pids controller."), "{note}");
        assert!(!note.contains("  "), "no run of spaces: {note}");
        assert!(note.contains("a root daemon, or shinyctl's systemd unit on cgroup v2 (`install.sh --service`"), "{note}");
        assert!(notes(&pids, &asked).is_empty(), "kept");
        assert!(notes(&none, &spec("")).is_empty(), "not asked for: the default");
        assert!(notes(&none, &spec("sandbox:\n  mode: off\n  tasks: 100\n")).is_empty(), "no fence asked for");
    }
}
