//! The copies' cgroups: finding what the daemon may use (its own cgroup
//! from /proc/self/cgroup, the hierarchies from /proc/self/mountinfo),
//! making a copy's cgroup with its limits, reading what the kernel counted,
//! and removing it when the copy is gone.
//!
//! cgroup v2 needs a delegated subtree (`Delegate=yes` in shinyctl.service):
//! the daemon's cgroup with memory and pids among its controllers and
//! writable. As v2 allows no process in a cgroup that has children with
//! controllers, the daemon first moves itself (and whatever else is there,
//! the load balancer it started) into the leaf `<its cgroup>/daemon`; the
//! copies go under `<its cgroup>/copies/`. A daemon started again from that
//! leaf (`serve -d` re-executes itself) uses its parent. cgroup v1 (a root
//! daemon on a machine with the v1 controllers mounted) has no such rule:
//! the copies go under `<its cgroup>/shinyctl-<tag>/` of the memory and the
//! pids hierarchy, `<tag>` being the home folder's, so daemons side by side
//! never share one.

use std::path::{Path, PathBuf};

use super::CgroupSample;

/// `SHINYCTL_CGROUPS=off` in the daemon's environment: no cgroup for the
/// copies (the memory watch instead), for a machine where the cgroups
/// misbehave, and to show the watch in the tests.
pub const OFF_VAR: &str = "SHINYCTL_CGROUPS";

/// The cgroups this daemon can give its copies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cgroups {
    /// Where the copies' cgroups are made.
    pub kind: Kind,
    /// What is missing and why (with the fix), for api.log and the notes;
    /// none when memory and pids both have a cgroup.
    pub missing: Option<String>,
}

/// Which cgroups, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// cgroup v2: one folder per copy under `copies`, holding both limits.
    V2 {
        /// `<the daemon's cgroup>/copies`, on the host.
        copies: PathBuf,
    },
    /// cgroup v1: a folder per copy in each hierarchy there is.
    V1 {
        /// `<memory mount>/<the daemon's memory cgroup>/shinyctl-<tag>`.
        memory: Option<PathBuf>,
        /// The same in the pids hierarchy.
        pids: Option<PathBuf>,
    },
    /// No cgroup: the daemon watches memory itself; tasks are not limited.
    None,
}

/// A mount of a cgroup hierarchy, from /proc/self/mountinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Mount {
    /// The cgroup path the mount shows at its mount point (`/` mostly).
    root: String,
    /// Where it is mounted.
    point: PathBuf,
    /// `cgroup2`, or `cgroup` with its controllers.
    v2: bool,
    /// Its super options (v1: the controllers, such as `memory`).
    options: Vec<String>,
}

impl Cgroups {
    /// Finds what this daemon may use, for the home folder's `tag`; for v2
    /// this moves the daemon into its leaf. Never fails: what is missing
    /// is said in [`Cgroups::missing`].
    pub fn discover(tag: &str) -> Cgroups {
        if std::env::var_os(OFF_VAR).is_some_and(|v| v == "off") {
            return Cgroups { kind: Kind::None, missing: Some(format!("switched off by {OFF_VAR}=off in the daemon's environment")) };
        }
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let mounts = parse_mountinfo(&std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default());
        let v2_why = match v2(&own, &mounts, std::env::var_os(SYSTEMD_VAR).is_some()) {
            Ok(copies) => return Cgroups { kind: Kind::V2 { copies }, missing: None },
            Err(why) => why,
        };
        let dir = |controller: &str| -> Result<PathBuf, String> {
            let path = v1_path(&own, controller).ok_or_else(|| format!("no cgroup v1 {controller} controller"))?;
            let m = mounts.iter().find(|m| !m.v2 && m.options.iter().any(|o| o == controller));
            let m = m.ok_or_else(|| format!("the cgroup v1 {controller} controller is not mounted"))?;
            let dir = below(m, &path).ok_or_else(|| format!("the daemon's {controller} cgroup {path} is outside its mount"))?;
            writable(&dir).map(|()| dir.join(format!("shinyctl-{tag}")))
        };
        let (memory, pids) = (dir("memory"), dir("pids"));
        let missing: Vec<String> = [&memory, &pids].iter().filter_map(|r| r.as_ref().err().cloned()).collect();
        let missing = (!missing.is_empty()).then(|| format!("{v2_why}; and {}", missing.join(", ")));
        match (memory.ok(), pids.ok()) {
            (None, None) => Cgroups { kind: Kind::None, missing },
            (memory, pids) => Cgroups { kind: Kind::V1 { memory, pids }, missing },
        }
    }

    /// True when copies get a memory cgroup (else the daemon watches).
    pub fn has_memory(&self) -> bool {
        matches!(&self.kind, Kind::V2 { .. } | Kind::V1 { memory: Some(_), .. })
    }

    /// True on cgroup v2, where a copy's one cgroup holds every controller.
    pub fn is_v2(&self) -> bool {
        matches!(&self.kind, Kind::V2 { .. })
    }

    /// True when copies get a pids cgroup (`tasks` is kept).
    pub fn has_pids(&self) -> bool {
        matches!(&self.kind, Kind::V2 { .. } | Kind::V1 { pids: Some(_), .. })
    }

    /// One line for api.log: what the copies' limits go through.
    pub fn describe(&self) -> String {
        let what = match &self.kind {
            Kind::V2 { copies } => format!("cgroup v2 (memory, pids) under {}", copies.display()),
            Kind::V1 { memory, pids } => {
                let shown: Vec<String> = [("memory", memory), ("pids", pids)]
                    .iter()
                    .filter_map(|(n, d)| d.as_ref().map(|d| format!("{n} in {}", d.display())))
                    .collect();
                format!("cgroup v1 ({})", shown.join(", "))
            }
            Kind::None => "no cgroup".to_string(),
        };
        match &self.missing {
            Some(why) => format!(
                "copies' limits: {what}; missing: {why}. Without a memory cgroup the daemon watches a limited copy's memory \
                 every 250 ms; without a pids cgroup sandbox.tasks is not kept. Fix: run shinyctl serve as root, or from \
                 shinyctl's systemd unit (`install.sh --service`: Delegate=yes and DelegateSubgroup=daemon, systemd 254 \
                 or newer) on cgroup v2"
            ),
            None => format!("copies' limits: {what}"),
        }
    }

    /// The folders of one copy's cgroups: where they are (made or not).
    fn dirs(&self, leaf: &str) -> Vec<(Controller, PathBuf)> {
        match &self.kind {
            Kind::V2 { copies } => vec![(Controller::Both, copies.join(leaf))],
            Kind::V1 { memory, pids } => {
                let m = memory.iter().map(|d| (Controller::Memory, d.join(leaf)));
                m.chain(pids.iter().map(|d| (Controller::Pids, d.join(leaf)))).collect()
            }
            Kind::None => Vec::new(),
        }
    }

    /// Makes a copy's cgroups afresh with its limits (`memory`: none is no
    /// limit); returns the folders its launcher joins. A v1 memory cgroup is
    /// made only for a copy with a memory limit.
    pub fn prepare(&self, leaf: &str, memory: Option<u64>, tasks: u32) -> Result<Vec<PathBuf>, String> {
        let mut joined = Vec::new();
        for (controller, dir) in self.dirs(leaf) {
            if controller == Controller::Memory && memory.is_none() {
                continue;
            }
            // A cgroup left by the copy's last process goes, so that its
            // counts (an OOM kill) start anew.
            clear(&dir)?;
            std::fs::create_dir_all(&dir).map_err(|e| format!("cannot make the cgroup {}: {e}", dir.display()))?;
            let limit = memory.map_or("max".to_string(), |m| m.to_string());
            let writes: Vec<(&str, String)> = match controller {
                Controller::Both => {
                    vec![
                        ("memory.max", limit),
                        ("memory.swap.max", "0".into()),
                        ("memory.oom.group", "1".into()),
                        ("pids.max", tasks.to_string()),
                    ]
                }
                Controller::Memory => vec![("memory.limit_in_bytes", limit.clone()), ("memory.memsw.limit_in_bytes", limit)],
                Controller::Pids => vec![("pids.max", tasks.to_string())],
            };
            for (file, value) in writes {
                // Swap limits and the OOM group are extras some kernels lack.
                let optional = matches!(file, "memory.swap.max" | "memory.memsw.limit_in_bytes" | "memory.oom.group");
                match std::fs::write(dir.join(file), &value) {
                    Err(e) if !optional => return Err(format!("cannot set {file} of {} to {value}: {e}", dir.display())),
                    _ => {}
                }
            }
            joined.push(dir);
        }
        Ok(joined)
    }

    /// What a copy's memory cgroup counted: OOM kills and its peak; none
    /// when it has none.
    pub fn memory_sample(&self, leaf: &str) -> Option<CgroupSample> {
        let (controller, dir) = self.dirs(leaf).into_iter().find(|(c, _)| *c != Controller::Pids)?;
        let (events, peak) = match controller {
            Controller::Both => ("memory.events", ["memory.peak", "memory.current"]),
            _ => ("memory.oom_control", ["memory.max_usage_in_bytes", "memory.usage_in_bytes"]),
        };
        let oom_kills = oom_kills(&std::fs::read_to_string(dir.join(events)).ok()?)?;
        let peak = peak.iter().find_map(|f| std::fs::read_to_string(dir.join(f)).ok()?.trim().parse().ok()).unwrap_or(0);
        Some(CgroupSample { oom_kills, peak })
    }

    /// True when `pid` is in the copy's memory cgroup (a copy started
    /// without one, or adopted from a daemon that had none, is not).
    pub fn holds_memory(&self, pid: u32, leaf: &str) -> bool {
        let Some((_, dir)) = self.dirs(leaf).into_iter().find(|(c, _)| *c != Controller::Pids) else { return false };
        let Ok(own) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else { return false };
        let path = match &self.kind {
            Kind::V2 { .. } => own.lines().find_map(|l| l.strip_prefix("0::")).map(str::to_string),
            _ => v1_path(&own, "memory"),
        };
        path.is_some_and(|p| {
            let p = p.trim_start_matches('/');
            !p.is_empty() && dir.ends_with(p)
        })
    }

    /// Removes the copies' cgroups that no running copy is in (`running`:
    /// their names): those left when a removal found the cgroup busy, or
    /// by a daemon that stopped before its copies. Only empty cgroups can
    /// be removed, so one still in use stays.
    pub fn sweep(&self, running: &std::collections::HashSet<String>) {
        let bases: Vec<&PathBuf> = match &self.kind {
            Kind::V2 { copies } => vec![copies],
            Kind::V1 { memory, pids } => memory.iter().chain(pids.iter()).collect(),
            Kind::None => Vec::new(),
        };
        for base in bases {
            let Ok(entries) = std::fs::read_dir(base) else { continue };
            for e in entries.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())) {
                if !running.contains(&*e.file_name().to_string_lossy()) {
                    let _ = std::fs::remove_dir(e.path());
                }
            }
            if matches!(self.kind, Kind::V1 { .. }) {
                let _ = std::fs::remove_dir(base);
            }
        }
    }

    /// Removes a copy's cgroups once its processes are gone (a cgroup with
    /// a process left in it stays, and goes at the copy's next start), and
    /// the v1 `shinyctl-<tag>` folders once they are empty.
    pub fn remove(&self, leaf: &str) {
        for (_, dir) in self.dirs(leaf) {
            match std::fs::remove_dir(&dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    tracing::debug!(cgroup = %dir.display(), "a copy's cgroup stays until the next sweep: {e}");
                }
                _ => {}
            }
            if let (Kind::V1 { .. }, Some(parent)) = (&self.kind, dir.parent()) {
                let _ = std::fs::remove_dir(parent);
            }
        }
    }
}

/// Which controllers a copy's cgroup folder is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Controller {
    /// cgroup v2: memory and pids in one folder.
    Both,
    /// cgroup v1's memory hierarchy.
    Memory,
    /// cgroup v1's pids hierarchy.
    Pids,
}

/// Set by systemd in the environment of every service it starts: then the
/// daemon's cgroup is its unit's.
const SYSTEMD_VAR: &str = "INVOCATION_ID";

/// cgroup v2 with memory and pids delegated to the daemon: moves the
/// daemon into its leaf, enables the controllers, returns `copies`.
/// `by_systemd`: started by systemd as a service ([`SYSTEMD_VAR`]).
fn v2(own: &str, mounts: &[Mount], by_systemd: bool) -> Result<PathBuf, String> {
    let path = own.lines().find_map(|l| l.strip_prefix("0::")).ok_or("no cgroup v2 (no `0::` line in /proc/self/cgroup)")?;
    let m = mounts.iter().find(|m| m.v2).ok_or("cgroup v2 is not mounted")?;
    let mut base = below(m, path).ok_or_else(|| format!("the daemon's cgroup {path} is outside the cgroup v2 mount"))?;
    // systemd's `DelegateSubgroup=daemon` starts the daemon in the leaf.
    if base.ends_with("daemon") && base.parent().is_some_and(|p| by_systemd || p.join("copies").is_dir()) {
        base.pop();
    } else if by_systemd {
        // systemd starts the next daemon in the unit's cgroup itself, which
        // the kernel refuses once controllers are enabled there for the
        // copies: the service would not start again while they run.
        return Err(format!(
            "systemd started the daemon in its unit's own cgroup {path}, not in its `daemon` leaf (DelegateSubgroup=daemon \
             needs systemd 254 or newer): copies' cgroups there would keep the service from starting again while they run"
        ));
    }
    if base == m.point {
        return Err(format!("the daemon runs in the root cgroup of {} (run it in a unit of its own with Delegate=yes)", m.point.display()));
    }
    let controllers = std::fs::read_to_string(base.join("cgroup.controllers")).unwrap_or_default();
    for c in ["memory", "pids"] {
        if !controllers.split_whitespace().any(|x| x == c) {
            return Err(format!("cgroup v2's {c} controller is not delegated to {} (Delegate=yes in the unit)", base.display()));
        }
    }
    writable(&base.join("cgroup.subtree_control"))?;
    let leaf = base.join("daemon");
    std::fs::create_dir_all(&leaf).map_err(|e| format!("cannot make {}: {e}", leaf.display()))?;
    // shinyctl's processes in the daemon's cgroup move to the leaf: the
    // daemon and the load balancer it started. Anything else there makes
    // enabling the controllers fail below: then this is no delegated cgroup.
    let procs = std::fs::read_to_string(base.join("cgroup.procs")).unwrap_or_default();
    for pid in procs.split_whitespace().filter(|p| is_shinyctl(p)) {
        let _ = std::fs::write(leaf.join("cgroup.procs"), pid);
    }
    std::fs::write(leaf.join("cgroup.procs"), std::process::id().to_string())
        .map_err(|e| format!("cannot move the daemon into {}: {e}", leaf.display()))?;
    let copies = base.join("copies");
    std::fs::create_dir_all(&copies).map_err(|e| format!("cannot make {}: {e}", copies.display()))?;
    for dir in [&base, &copies] {
        std::fs::write(dir.join("cgroup.subtree_control"), "+memory +pids")
            .map_err(|e| format!("cannot enable memory and pids in {}: {e}", dir.display()))?;
    }
    Ok(copies)
}

/// Removes a copy's cgroup left from its last process. Processes still in
/// it are what that process left behind: they are killed, and the removal
/// is tried again for up to 200 ms. A cgroup that stays is an error (its
/// counts would be taken for the new process's).
fn clear(dir: &Path) -> Result<(), String> {
    for _ in 0..20 {
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(_) => {}
        }
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    Err(format!("the cgroup {} of the copy's last process cannot be removed", dir.display()))
}

/// True when process `pid` runs shinyctl (its argv[0] is a `shinyctl`).
fn is_shinyctl(pid: &str) -> bool {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let argv0 = cmdline.split(|b| *b == 0).next().unwrap_or_default();
    use std::os::unix::ffi::OsStrExt;
    Path::new(std::ffi::OsStr::from_bytes(argv0)).file_name().is_some_and(|n| n == "shinyctl")
}

/// The folder of the cgroup `path` in mount `m`.
fn below(m: &Mount, path: &str) -> Option<PathBuf> {
    let rel = if m.root == "/" { Some(path) } else { path.strip_prefix(m.root.as_str()) }?;
    Some(m.point.join(rel.trim_start_matches('/')))
}

/// Ok when the daemon may write in `p` (make folders, set limits).
fn writable(p: &Path) -> Result<(), String> {
    nix::unistd::access(p, nix::unistd::AccessFlags::W_OK).map_err(|e| format!("{} is not writable ({e})", p.display()))
}

/// The daemon's cgroup v1 path for `controller`, from /proc/self/cgroup
/// (`4:memory:/a/b`; a line may name several controllers, `2:cpu,cpuacct:/`).
fn v1_path(own: &str, controller: &str) -> Option<String> {
    own.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, names, path) = (f.next()?, f.next()?, f.next()?);
        names.split(',').any(|n| n == controller).then(|| path.to_string())
    })
}

/// The cgroup mounts in the text of /proc/self/mountinfo, their paths with
/// the kernel's octal escapes undone.
fn parse_mountinfo(text: &str) -> Vec<Mount> {
    crate::sys::procfs::parse_mountinfo(text)
        .into_iter()
        .filter(|m| matches!(m.fs_type.as_str(), "cgroup" | "cgroup2"))
        .map(|m| Mount {
            root: m.root.to_string_lossy().into_owned(),
            point: m.point,
            v2: m.fs_type == "cgroup2",
            options: m.super_options,
        })
        .collect()
}

/// `oom_kill N` from memory.events (v2) or memory.oom_control (v1).
fn oom_kills(text: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix("oom_kill ")).and_then(|n| n.trim().parse().ok())
}

#[cfg(test)]
mod tests;
