//! Copies nobody recorded. The cycle records a copy (its number and port,
//! no process yet) before it starts it, and its process right after; a
//! daemon killed in between leaves a running copy that its state does not
//! name. At start the daemon looks for its home's copy launchers by the
//! marker in their command line (`shinyctl launch … --home HOME`, since a
//! fenced copy's environment no longer names the home), adopts one whose
//! record waits for a process (the intent), and stops any other, with a
//! line in api.log each.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::Path;

use crate::sys::procfs;
use crate::wire::launch::Launch;

use crate::serve::copies::act;
use crate::serve::now_ms;
use crate::serve::Daemon;

/// A copy launcher of this home found running.
#[derive(Debug, Clone, PartialEq)]
pub struct Found {
    /// The launcher's PID (what the daemon records for a copy).
    pub pid: u32,
    /// Its start time, in clock ticks since boot.
    pub start: u64,
    /// Its arguments.
    pub launch: Launch,
}

/// The copy launchers of `home` that run: processes whose command line is
/// `… launch ARGS` with `--home HOME`, leaving out their own clones (the
/// copy's init starts as a clone of its launcher, with the same command
/// line).
pub fn launchers_of(home: &Path) -> Vec<Found> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    let found: Vec<(u32, u32, Launch)> = dir
        .filter_map(|e| {
            let pid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
            let launch = launch_of(pid)?;
            (launch.home == home).then(|| (pid, procfs::parent_of(pid).unwrap_or(0), launch))
        })
        .collect();
    found
        .iter()
        .filter(|(_, parent, _)| !found.iter().any(|(p, _, _)| p == parent))
        .filter_map(|(pid, _, launch)| Some(Found { pid: *pid, start: procfs::start_ticks(*pid)?, launch: launch.clone() }))
        .collect()
}

/// The launcher's arguments, when `pid` is a copy launcher.
fn launch_of(pid: u32) -> Option<Launch> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let args: Vec<OsString> = raw.split(|b| *b == 0).filter(|a| !a.is_empty()).map(|a| OsString::from_vec(a.to_vec())).collect();
    if args.get(1).map(|a| a.as_os_str()) != Some("launch".as_ref()) {
        return None;
    }
    Launch::parse(&args[2..]).ok()
}

impl Daemon {
    /// Adopts or stops each running copy launcher of this home that no
    /// recorded copy names. Returns how many were adopted and stopped.
    pub(in crate::serve) fn settle_unrecorded(&mut self, found: &[Found]) -> (usize, usize) {
        let (mut adopted, mut stopped) = (0, 0);
        for f in found {
            let known = self.apps.values().any(|a| a.recorded.state.copies.iter().any(|r| r.pid == Some(f.pid)));
            if known {
                continue;
            }
            let waiting = self
                .apps
                .get_mut(&f.launch.app)
                .and_then(|a| a.recorded.state.copies.iter_mut().find(|r| r.copy == f.launch.copy && r.pid.is_none()));
            match waiting {
                Some(rec) => {
                    rec.pid = Some(f.pid);
                    rec.pid_start = Some(f.start);
                    rec.port = f.launch.port;
                    rec.started_ms = Some(now_ms());
                    rec.left_down = None;
                    tracing::warn!(app = %f.launch.app, copy = f.launch.copy, pid = f.pid,
                        "adopted copy {} of {}: it was started, and the daemon ended before recording its process", f.launch.copy, f.launch.app);
                    adopted += 1;
                }
                None => {
                    tracing::warn!(app = %f.launch.app, copy = f.launch.copy, pid = f.pid,
                        "stopping copy {} of {} (PID {}): no record of it names it", f.launch.copy, f.launch.app, f.pid);
                    act::stop_process(f.pid, Some(f.start));
                    stopped += 1;
                }
            }
        }
        if adopted > 0 {
            for app in self.apps.values_mut() {
                crate::serve::state_files::record(&app.recorded, &mut app.tracked);
            }
        }
        (adopted, stopped)
    }
}
