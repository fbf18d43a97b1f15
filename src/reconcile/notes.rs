//! The lines `status` prints under an app's table: a stopped or sleeping
//! app, draining copies and how long they have left, copies stopped over a
//! limit, copies that don't start (with their last error line), copies left
//! down. Pure, like [`decide`](super::decide): the caller reads the logs.

use std::time::Duration;

use crate::manifest::AppSpec;
use crate::sys::fmt::{duration, DurationStyle};
use crate::wire::AppState;

use super::{Observed, Process, SLOW_START_MS};

/// The line under status for a copy left down: why, its last error, its log.
fn left_down_note(name: &str, copy: u32, why: &str, log_of: &dyn Fn(u32) -> CopyLog) -> String {
    let log = log_of(copy);
    match log.last_error {
        Some(error) => format!("{name}: copy {copy} is left down: {why}. Its last error: \"{error}\". Its log: {}", log.path),
        None => format!("{name}: copy {copy} is left down: {why}. Its log: {}", log.path),
    }
}

/// What status says of a copy's log: where it is and its last error line.
#[derive(Debug, Clone, Default)]
pub struct CopyLog {
    /// The log's path.
    pub path: String,
    /// The last line of R's that reads as an error (`Error…`), if any.
    pub last_error: Option<String>,
}

/// The lines status prints under the table for one app: draining copies and
/// how long they have left, copies stopped over their memory limit, copies
/// that don't start (with their last error line), copies left down. `log_of` is asked only for the copies named.
pub fn notes(spec: &AppSpec, state: &AppState, observed: &Observed, now_ms: u64, log_of: &dyn Fn(u32) -> CopyLog) -> Vec<String> {
    let settings = spec.settings_hash();
    let name = &spec.name;
    let mut out = Vec::new();
    if let Some(since) = state.stopped_since_ms {
        let running = state.copies.iter().filter(|r| r.pid.is_some()).count();
        let stopping = if running > 0 { format!("; {running} of its copies still stopping") } else { String::new() };
        out.push(format!(
            "{name}: stopped for {} (shinyctl stop){stopping}; its port answers that it is stopped. `shinyctl start {name}` starts it.",
            duration(Duration::from_millis(now_ms.saturating_sub(since)), DurationStyle::Span)
        ));
        return out;
    }
    if let Some(since) = state.asleep_since_ms {
        out.push(format!(
            "{name}: asleep for {} (idle-timeout {}); the first request wakes it.",
            duration(Duration::from_millis(now_ms.saturating_sub(since)), DurationStyle::Span),
            duration(Duration::from_millis(spec.scale.idle_timeout_ms), DurationStyle::Span)
        ));
        // A version deployed while asleep that failed its check.
        out.extend(state.copies.iter().filter_map(|rec| Some(left_down_note(name, rec.copy, rec.left_down.as_deref()?, log_of))));
        // A wake that failed: the copy's last start ended before it was ready.
        for rec in state.copies.iter().filter(|r| r.left_down.is_none() && r.crashes > 0 && !r.ever_ready) {
            let Some(exit) = rec.last_exit else { continue };
            let log = log_of(rec.copy);
            let error = log.last_error.map(|e| format!(" Its last error: \"{e}\".")).unwrap_or_default();
            out.push(format!(
                "{name}: its last wake failed: copy {} {} before it was ready; the next request tries again.{error} Its log: {}",
                rec.copy,
                exit.describe(),
                log.path
            ));
        }
        return out;
    }
    let old_copies = || {
        state.copies.iter().filter(|r| {
            (r.revision != state.revision || r.settings != settings) && r.drain_started_ms.is_none() && r.stop_started_ms.is_none()
        })
    };
    let redeploying = old_copies().next().is_some();
    // Whether the version before serves: one of its copies is ready.
    let old_serving =
        old_copies().any(|r| matches!(observed.copies.get(&r.copy).map(|s| s.process), Some(Process::Running { ready: true })));
    for rec in &state.copies {
        let seen = observed.copies.get(&rec.copy);
        let ready = matches!(seen.map(|s| s.process), Some(Process::Running { ready: true }));
        if let Some(since) = rec.drain_started_ms {
            if rec.stop_started_ms.is_none() && rec.hurried {
                out.push(format!("{name}: copy {} stops now (--now), once the requests in flight to it are answered.", rec.copy));
            } else if rec.stop_started_ms.is_none() {
                let sessions = seen.map_or(0, |s| s.sessions);
                let left = (since + spec.scale.drain_timeout_ms).saturating_sub(now_ms);
                let plural = if sessions == 1 { "session" } else { "sessions" };
                out.push(format!(
                    "{name}: copy {} is draining with {sessions} {plural}; it stops when they end, or in {} at the latest.",
                    rec.copy,
                    duration(Duration::from_millis(left), DurationStyle::Span)
                ));
            }
            continue;
        }
        if let Some(why) = &rec.left_down {
            out.push(left_down_note(name, rec.copy, why, log_of));
            continue;
        }
        let times = if rec.crashes == 1 { "once".to_string() } else { format!("{} times", rec.crashes) };
        // Shown also once it is back, until it stays up: a copy that grows
        // past its limit again is up most of the time.
        if let Some(m) = rec.last_exit.and_then(|e| e.memory).filter(|_| rec.crashes > 0) {
            out.push(format!("{name}: copy {} was stopped: {} ({times}). Its log: {}", rec.copy, m.describe(), log_of(rec.copy).path));
            continue;
        }
        if let Some(d) = rec.last_exit.and_then(|e| e.disk).filter(|_| rec.crashes > 0) {
            out.push(format!("{name}: copy {} was stopped: {} ({times}). Its log: {}", rec.copy, d.describe(), log_of(rec.copy).path));
            continue;
        }
        let current = rec.revision == state.revision && rec.settings == settings;
        if let Some(port) = rec.moving_from {
            out.push(format!("{name}: copy {}'s port {port} is taken by another program; it moves to another port.", rec.copy));
        } else if rec.crashes > 0 && !ready {
            let exit = rec.last_exit.map(|e| e.describe()).unwrap_or_else(|| "exited".into());
            let lead = if current && redeploying {
                let meanwhile = if old_serving { "the old copies keep serving" } else { "no version serves meanwhile" };
                format!("{name}: copy {} doesn't start: it {exit} ({times}); {meanwhile}.", rec.copy)
            } else {
                format!("{name}: copy {} is crash-looping: it {exit} ({times}).", rec.copy)
            };
            let log = log_of(rec.copy);
            match log.last_error {
                Some(error) => out.push(format!("{lead} Its last error: \"{error}\". Its log: {}", log.path)),
                None => out.push(format!("{lead} Its log: {}", log.path)),
            }
        } else if rec.pid.is_some() && !ready && rec.stop_started_ms.is_none() {
            if let Some(started) = rec.started_ms.filter(|s| now_ms.saturating_sub(*s) >= SLOW_START_MS) {
                out.push(format!(
                    "{name}: copy {} has been starting for {} and is not ready. Its log: {}",
                    rec.copy,
                    duration(Duration::from_millis(now_ms - started), DurationStyle::Span),
                    log_of(rec.copy).path
                ));
            }
        }
    }
    out
}
