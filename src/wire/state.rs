//! The records the daemon keeps on disk: an app's `state.json` (its copies
//! and their history, its releases) and `registry.json` (every app's
//! manifest as applied). A build reads the files an earlier build wrote:
//! every field added since has a default.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::manifest::AppSpec;

/// A version of an app's copies: what a copy record says it runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct HeldVersion {
    /// Its revision.
    pub revision: u64,
    /// Its settings' hash.
    pub settings: String,
    /// Its release.
    pub release: Option<String>,
}

/// An app's `state.json`: what happened, never what should happen.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AppState {
    /// The app's name when this was written.
    pub app: String,
    /// Raised by `restart`; copies started before it are outdated.
    pub revision: u64,
    /// The number the next new copy gets; copy numbers are never reused.
    pub next_copy: u32,
    /// Set by `restart --now` (or `apply --now`): outdated and removed copies
    /// stop as soon as the new ones are ready, without draining.
    #[serde(default)]
    pub stop_now: bool,
    /// Unix ms when the app was put to sleep (idle-timeout); none while it
    /// is awake. Asleep, its copies keep their numbers, ports and disks.
    #[serde(default)]
    pub asleep_since_ms: Option<u64>,
    /// Unix ms when the app was last seen coming up: deployed, woken, or a
    /// copy on its first start (not crash-looping). The earliest it can fall
    /// asleep is idle-timeout after this. None while asleep.
    #[serde(default)]
    pub awake_since_ms: Option<u64>,
    /// Every copy the daemon knows of, running or not.
    pub copies: Vec<CopyRecord>,
    /// The releases kept on disk, oldest first: the current one, the one
    /// before it, and any other a copy still runs.
    #[serde(default)]
    pub releases: Vec<Release>,
    /// The id of the release new copies run; none for an app deployed
    /// before releases existed (its copies run working-dir).
    #[serde(default)]
    pub release: Option<String>,
    /// The id of the release deployed before the current one: what
    /// `rollback` goes back to.
    #[serde(default)]
    pub previous_release: Option<String>,
    /// The current release came from `rollback`, so the manifest differs
    /// from what runs; cleared by the next apply or restart.
    #[serde(default)]
    pub rolled_back: bool,
    /// Unix ms when `shinyctl stop` stopped the app: it runs no copy and
    /// its port answers that it is stopped, until `shinyctl start`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_since_ms: Option<u64>,
    /// The version that served when `shinyctl stop` came during a deploy
    /// that had not taken over (a broken one, or one still starting): `start`
    /// runs it beside the deployed one, which takes over only once ready,
    /// as before the stop (README, "Commands").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_version: Option<HeldVersion>,
    /// The app's own uid (and gid) on the machine, which its copies run as
    /// under a root daemon without `run-as` (README, "Identities"); given at
    /// its first copy's start, kept for good.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// The active copies wanted now, between `replicas` and `max-replicas`
    /// (README, "Capacity"); none: `replicas`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_wanted: Option<u32>,
    /// Unix ms when the app last grew.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grew_at_ms: Option<u64>,
    /// Unix ms when the app last shrank.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shrank_at_ms: Option<u64>,
    /// Unix ms since when the open sessions would stay below `scale-at`
    /// with one active copy fewer; none while they would not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub low_since_ms: Option<u64>,
    /// Why the app does not grow although its load asks for it: the memory
    /// bound (a line under status); none otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_by_memory: Option<String>,
    /// How many times the app grew (metrics).
    #[serde(default)]
    pub grows: u64,
    /// How many times the app shrank, a sleep's included (metrics).
    #[serde(default)]
    pub shrinks: u64,
}

/// The second name of an app's state file: the last version of it written
/// with fsync (README, "Files"), read when the state file itself is empty or
/// torn after a power cut.
pub fn synced_path(path: &std::path::Path) -> std::path::PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".synced");
    std::path::PathBuf::from(p)
}

impl AppState {
    /// This state less what only describes the processes of this boot and
    /// the moment: PIDs, their start times and readiness, when the app fell
    /// asleep or woke, the load's low mark. What is left is what a power
    /// cut must not lose (releases, revisions, copy numbers and ports,
    /// crashes, the operator's stop). After a power cut no process is left,
    /// so an earlier value of what is cleared here is as good as the last:
    /// a save that changes only that need not wait for the disk (README,
    /// "Files").
    pub fn lasting(&self) -> AppState {
        let mut s = self.clone();
        s.asleep_since_ms = None;
        s.awake_since_ms = None;
        s.low_since_ms = None;
        s.held_by_memory = None;
        for c in &mut s.copies {
            c.pid = None;
            c.pid_start = None;
            c.started_ms = None;
            c.ever_ready = false;
        }
        s
    }
}

/// A release: a snapshot of working-dir taken by a deploy, which its copies
/// run from (read-only), with the settings it was deployed with.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Release {
    /// Its id, time-sortable (`YYYYMMDDTHHMMSS-xxxx`, UTC), not the revision.
    pub id: String,
    /// Its folder, `$SHINYCTL_HOME/releases/<app-group>/<app-name>/<id>`.
    pub dir: std::path::PathBuf,
    /// Unix ms when it was taken.
    pub taken_ms: u64,
    /// The size of its files, in bytes.
    pub bytes: u64,
    /// How many files and symlinks it holds.
    pub files: u64,
    /// How long taking it took, in ms.
    pub took_ms: u64,
    /// The start spec it was deployed with: what `rollback` redeploys it with.
    pub deployed: crate::manifest::StartSpec,
    /// Every copy that has run it: their logs go when it is deleted and
    /// they no longer exist.
    #[serde(default)]
    pub copies: Vec<u32>,
    /// Whether a copy of it has been ready (served): `Some(false)` until
    /// then; none for a release recorded before this was kept (taken to
    /// have served). One that never served is no rollback target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served: Option<bool>,
    /// When it was last made current, as a count of the app's deploys and
    /// rollbacks (`release::record`, `release::roll_back`): the deploy
    /// order, which a rollback changes and the order taken does not. 0 for
    /// a release recorded before this was kept (then the order taken).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub made_current: u64,
    /// A rollback left it (`shinyctl rollback` from it, no `--to`): no
    /// later rollback goes back to it, so `rollback` again goes further
    /// back; made current again (`--to`), it is a target again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rolled_away: bool,
}

/// For serde: a count left out of the file while 0.
fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// How a `left_down` reason begins when `sandbox.mode: strict` refused the
/// copy (status shows such a copy as `refused`).
pub const REFUSED: &str = "refused: ";

/// The `left_down` reason of a copy refused for `why`.
pub fn refused(why: &str) -> String {
    format!("{REFUSED}{why}")
}

/// One copy's identity and history.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CopyRecord {
    /// The copy number, from 1.
    pub copy: u32,
    /// Its process, while it has one.
    pub pid: Option<u32>,
    /// The process's start time in clock ticks since boot (field 22 of
    /// `/proc/<pid>/stat`), so a reused PID is never taken for the copy.
    pub pid_start: Option<u64>,
    /// Its port on 127.0.0.1 (kept while it is down, so it comes back there).
    pub port: u16,
    /// The revision it runs.
    pub revision: u64,
    /// The hash of the settings it was started with.
    pub settings: String,
    /// Unix ms when its current process started.
    pub started_ms: Option<u64>,
    /// Crashes since it last stayed up for a minute.
    pub crashes: u32,
    /// How its last process ended.
    pub last_exit: Option<Exit>,
    /// Unix ms when it began to drain.
    pub drain_started_ms: Option<u64>,
    /// Unix ms when it was told to stop; it is forgotten once its process is gone.
    pub stop_started_ms: Option<u64>,
    /// Why it is left down on purpose (restart-policy, or `mode: strict`'s
    /// refusal: see [`refused`]), shown under status.
    pub left_down: Option<String>,
    /// The id of the release it runs; none for a copy started before
    /// releases existed (it runs working-dir).
    #[serde(default)]
    pub release: Option<String>,
    /// The port it is moving away from: another program listens there, so
    /// its process is stopped and started again on another port (not a
    /// crash). None otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moving_from: Option<u16>,
    /// It drains because of `--now` (or `delete --now`): it stops once no
    /// request is in flight to it, not when its sessions end. Kept on the
    /// copy, so a later apply or restart without `--now` does not slow its
    /// stop down again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hurried: bool,
    /// It checks a version deployed while the app slept: one copy starts,
    /// and only once it has been ready does the app give up the sleeping
    /// copies of the version before (a broken version never takes over,
    /// asleep or awake). Cleared once it has been ready.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub checking: bool,
    /// It was told to stop for not being ready within `start-timeout` (that
    /// many ms): its end is a crash, said so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_timed_out: Option<u64>,
    /// What the disk watch lets this copy's disk hold beyond `sandbox.disk`,
    /// in bytes, fixed at its first measure and never raised: what its disk
    /// already held then (files kept from a build before `sandbox.disk`),
    /// `0` for a disk within its size. A copy the watch stopped starts again
    /// on the same disk and is held to the same bound, not to what it wrote
    /// meanwhile. None: not measured yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_allowance: Option<u64>,
    /// Its current process has been ready once. Only a process that never
    /// was is held to `start-timeout`: one that lost its readiness later,
    /// or one a restarted daemon adopts before its probe answers, is not.
    /// A record from before this was kept reads as ready once.
    #[serde(default = "ready_once_by_default")]
    pub ever_ready: bool,
}

/// For a copy recorded before `CopyRecord::ever_ready` was kept.
fn ready_once_by_default() -> bool {
    true
}

/// How a process ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exit {
    /// Unix ms when the exit was seen.
    pub at_ms: u64,
    /// The exit status, when the process exited.
    pub code: Option<i32>,
    /// The signal that ended it, when it was killed.
    pub signal: Option<i32>,
    /// It was stopped for going over its memory limit (by the kernel in
    /// its cgroup, or by the daemon's watch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStop>,
    /// It was stopped because it was not ready within `start-timeout`
    /// (that many ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_timeout_ms: Option<u64>,
    /// It was stopped by the daemon's watch for writing more than its disk
    /// holds (`sandbox.disk`, where the kernel does not keep it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<DiskStop>,
}

/// A copy stopped for its disk: what its scratch, /tmp and /dev/shm held
/// together and `sandbox.disk`, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskStop {
    /// What the three folders held when it was stopped.
    pub used: u64,
    /// `sandbox.disk`.
    pub limit: u64,
}

impl DiskStop {
    /// "its disk held 70M of its 64M (sandbox.disk)".
    pub fn describe(&self) -> String {
        let show = |b| crate::sys::fmt::size(b, crate::sys::fmt::SizeStyle::Manifest);
        format!("its disk (scratch, /tmp, /dev/shm) held {} of its {} (sandbox.disk)", show(self.used), show(self.limit))
    }
}

/// A copy stopped for its memory: what it used and its limit, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryStop {
    /// Its memory when it was stopped: the resident memory of its process
    /// tree (the daemon's watch) or its cgroup's peak (the kernel's limit).
    pub used: u64,
    /// `sandbox.memory`.
    pub limit: u64,
}

impl Exit {
    /// True for a clean exit with status 0. An exit whose status is unknown
    /// (an adopted process), or a copy stopped for its memory, counts as a
    /// failure.
    pub fn success(&self) -> bool {
        self.code == Some(0) && self.signal.is_none() && self.memory.is_none() && self.start_timeout_ms.is_none() && self.disk.is_none()
    }

    /// "exited with status 1", "was killed by signal 9", …
    pub fn describe(&self) -> String {
        if let Some(m) = self.memory {
            return format!("was stopped: {}", m.describe());
        }
        if let Some(d) = self.disk {
            return format!("was stopped: {}", d.describe());
        }
        if let Some(limit) = self.start_timeout_ms {
            return format!(
                "was stopped: not ready within start-timeout {}",
                crate::sys::fmt::duration(std::time::Duration::from_millis(limit), crate::sys::fmt::DurationStyle::Span)
            );
        }
        match (self.code, self.signal) {
            (_, Some(sig)) => format!("was killed by signal {sig}"),
            (Some(code), None) => format!("exited with status {code}"),
            (None, None) => "exited".to_string(),
        }
    }
}

impl MemoryStop {
    /// "2.1G, over its memory limit of 2G".
    pub fn describe(&self) -> String {
        use crate::sys::fmt::{size, SizeStyle::Manifest};
        format!("{}, over its memory limit of {}", size(self.used, Manifest), size(self.limit, Manifest))
    }
}

// ---------------------------------------------------------------------------
// The API: command ↔ daemon
// ---------------------------------------------------------------------------

/// `registry.json`: every app the daemon manages. The daemon reads and writes it
/// (`serve::state_files`); the record is here with `state.json`'s.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Registry {
    /// The applied spec of each app, by app name.
    pub apps: BTreeMap<String, AppSpec>,
    /// The apps whose delete is under way (their copies stopping), by app
    /// name: a daemon that starts while one is, after a `shutdown` in the
    /// middle of it, finishes it (the copies stopped, their disks, the state
    /// file and the releases removed). Absent when empty, so a registry
    /// without deletes reads the same to a daemon from before the field.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub deleting: BTreeMap<String, AppSpec>,
}
