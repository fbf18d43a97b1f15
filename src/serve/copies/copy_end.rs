//! A copy's end, said where an operator looks: in the copy's own log (with
//! the time, R's PID, how it ended and why) and in the daemon's log, at
//! WARN when nobody asked for it (README, "Logs").

use crate::home::Home;
use crate::manifest::AppSpec;
use crate::wire::{CopyRecord, Exit};

/// What an operator asked of the whole app, which ends its copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppStop {
    /// `shinyctl stop`.
    Stop,
    /// `shinyctl delete`.
    Delete,
}

/// Why a copy ended, as its log says it. `app`: the app is stopped or
/// being deleted, which says why a copy shinyctl ended went.
pub fn reason(rec: &CopyRecord, exit: &Exit, asked: bool, app: Option<AppStop>) -> &'static str {
    let by_shinyctl = asked || rec.stop_started_ms.is_some() || rec.drain_started_ms.is_some();
    if exit.memory.is_some() {
        "over its memory limit"
    } else if exit.disk.is_some() {
        "over its disk size"
    } else if exit.start_timeout_ms.is_some() || rec.start_timed_out.is_some() {
        "not ready within start-timeout"
    } else if by_shinyctl && app == Some(AppStop::Stop) {
        "stopped by shinyctl stop"
    } else if by_shinyctl && app == Some(AppStop::Delete) {
        "stopped by shinyctl delete"
    } else if rec.drain_started_ms.is_some() {
        "drained"
    } else if asked || rec.stop_started_ms.is_some() {
        "stopped by shinyctl"
    } else if exit.success() {
        // R ended by itself with status 0 (`stopApp()`, `quit()`).
        "exited on its own"
    } else {
        "crash"
    }
}

/// Writes the end of copy `rec` (whose launcher's end is `exit`; `asked`:
/// shinyctl stopped it; `app`: the app is stopped or being deleted) to its
/// log and the daemon's.
pub fn note(home: &Home, spec: &AppSpec, rec: &CopyRecord, exit: &Exit, asked: bool, app: Option<AppStop>) {
    let why = reason(rec, exit, asked, app);
    let launcher = rec.pid.unwrap_or_default();
    let scratch = home.scratch_dir(&spec.group, &spec.name, rec.copy);
    // The launcher's report names R; a copy without one is R itself.
    let r_pid = crate::wire::launch::report::read_report(&scratch, launcher).and_then(|r| r.r_pid).unwrap_or(launcher);
    let how = exit.describe();
    if why == "crash" || why == "exited on its own" {
        tracing::warn!(app = spec.name, copy = rec.copy, r_pid, launcher, "copy {} {how} ({why})", rec.copy);
    } else {
        tracing::info!(app = spec.name, copy = rec.copy, r_pid, launcher, "copy {} {how} ({why})", rec.copy);
    }
    let line = format!(
        "--- shinyctl: copy {} (R's PID {r_pid}) ended at {}: it {how} ({why}) ---",
        rec.copy,
        crate::sys::procfs::local_rfc3339(exit.at_ms)
    );
    append_line(&home.copy_log(&spec.group, &spec.name, rec.copy), &line);
}

/// Appends a line of shinyctl's to a copy's log.
pub fn append_line(log: &std::path::Path, line: &str) {
    use std::io::Write;
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(log) {
        let _ = writeln!(f, "{line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_end_nobody_asked_for_is_a_crash_and_the_rest_say_why() {
        let rec = CopyRecord::default();
        let exit = Exit { signal: Some(9), ..Exit::default() };
        assert_eq!(reason(&rec, &exit, false, None), "crash");
        let clean = Exit { code: Some(0), signal: None, ..Exit::default() };
        assert_eq!(reason(&rec, &clean, false, None), "exited on its own", "status 0, nobody asked: no crash");
        assert_eq!(reason(&rec, &exit, true, None), "stopped by shinyctl");
        let drained = CopyRecord { drain_started_ms: Some(1), ..CopyRecord::default() };
        assert_eq!(reason(&drained, &exit, true, None), "drained");
        assert_eq!(reason(&drained, &exit, false, Some(AppStop::Stop)), "stopped by shinyctl stop");
        assert_eq!(reason(&rec, &exit, true, Some(AppStop::Delete)), "stopped by shinyctl delete");
        assert_eq!(reason(&rec, &exit, false, Some(AppStop::Delete)), "crash", "a copy that crashed meanwhile");
        let timed = Exit { start_timeout_ms: Some(60_000), ..exit };
        assert_eq!(reason(&rec, &timed, true, None), "not ready within start-timeout");
        let memory = Exit { memory: Some(crate::wire::MemoryStop { used: 2, limit: 1 }), ..exit };
        assert_eq!(reason(&rec, &memory, true, None), "over its memory limit");
    }
}
