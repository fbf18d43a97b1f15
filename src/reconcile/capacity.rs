//! Capacity: how many active copies an app wants now, between `replicas`
//! and `max-replicas`, from the open sessions and the time (README,
//! "Capacity"). Pure, like the rest of `decide`.
//!
//! The app grows as soon as the open sessions reach `scale-at` of the active
//! copies' capacity (`active × max-sessions`), or when the load balancer
//! found every active copy full; it grows to the fewest copies that hold the
//! load below `scale-at`. It shrinks one copy at a time, and only once the
//! load would have stayed below `scale-at` with one copy fewer for
//! `scale-down-after`, counted from the last change too: a load that goes up
//! and down faster than that never makes it grow and shrink in turn.

use super::MemoryRoom;
use crate::manifest::AppSpec;
use crate::wire::{AppState, CapacityStatus, Role};

/// What capacity decided this cycle.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Step {
    /// The active copies wanted.
    pub active: u32,
    /// Why it grew or shrank this cycle, for the daemon's log; none when it
    /// did neither.
    pub change: Option<String>,
    /// When the load will have been low long enough to shrink, in unix ms.
    pub wake_at_ms: Option<u64>,
}

/// The load that makes `active` copies count as full enough to grow:
/// `scale-at × active × max-sessions` sessions.
fn threshold(spec: &AppSpec, max_sessions: u32, active: u32) -> f64 {
    spec.scale.scale_at * f64::from(active) * f64::from(max_sessions)
}

/// Decides the active copies wanted from `load` (the open sessions on the
/// copies that serve, draining ones aside) and `full` (the load balancer
/// sent a visitor to the warm copy because every active copy was full),
/// recording it, when it changed and since when the load is low in `st`.
/// Growth stops short where one more copy would take the copies past the
/// memory bound (`memory`), and `st` says so until the app needs no more.
pub(super) fn step(spec: &AppSpec, st: &mut AppState, load: u64, full: bool, memory: Option<MemoryRoom>, now_ms: u64) -> Step {
    let (least, most) = (spec.scale.replicas, spec.scale.max_active());
    let Some(max_sessions) = spec.scale.max_sessions.filter(|_| most > least) else {
        // No limit, or no room to grow: nothing here changes.
        st.active_wanted = None;
        st.low_since_ms = None;
        st.held_by_memory = None;
        return Step { active: least, ..Step::default() };
    };
    let at = |n: u32| threshold(spec, max_sessions, n);
    let sessions = load as f64;
    let mut n = st.active_wanted.unwrap_or(least).clamp(least, most);
    let mut out = Step::default();
    let wants_more = n < most && (sessions >= at(n) || full);
    // The copies the memory bound leaves room for (each step up starts one).
    let room = memory.map_or(u64::MAX, |m| m.bound.saturating_sub(m.used) / m.per_copy.max(1));
    st.held_by_memory = None;
    if wants_more && room == 0 {
        let m = memory.unwrap_or(MemoryRoom { used: 0, bound: 0, per_copy: 0 });
        let show = |b| crate::sys::fmt::size(b, crate::sys::fmt::SizeStyle::Manifest);
        st.held_by_memory = Some(format!(
            "does not grow past {n} active copies: the copies use {} of the {} SHINYCTL_MAX_MEMORY allows, and one more takes about {}",
            show(m.used),
            show(m.bound),
            show(m.per_copy)
        ));
    } else if wants_more {
        let from = n;
        let top = most.min(from.saturating_add(u32::try_from(room).unwrap_or(u32::MAX)));
        n += 1;
        while n < top && sessions >= at(n) {
            n += 1;
        }
        let why = if sessions >= at(from) {
            format!(
                "{load} open sessions reached scale-at {} of {} ({from} × max-sessions {max_sessions})",
                spec.scale.scale_at,
                from * max_sessions
            )
        } else {
            format!("every active copy was full when a visitor came ({load} open sessions, {from} × max-sessions {max_sessions})")
        };
        out.change = Some(format!("grows from {from} to {n} active copies: {why}"));
        st.grew_at_ms = Some(now_ms);
        st.grows += 1;
        st.low_since_ms = None;
    } else if n > least && sessions < at(n - 1) {
        let since = *st.low_since_ms.get_or_insert(now_ms);
        let last_change = st.grew_at_ms.max(st.shrank_at_ms).unwrap_or(0);
        let due = since.max(last_change).saturating_add(spec.scale.scale_down_after_ms);
        if now_ms >= due {
            n -= 1;
            out.change = Some(format!(
                "shrinks from {} to {n} active copies: the open sessions stayed under scale-at {} of {} ({n} × max-sessions {max_sessions}) for {}",
                n + 1,
                spec.scale.scale_at,
                n * max_sessions,
                crate::sys::fmt::duration(std::time::Duration::from_millis(spec.scale.scale_down_after_ms), crate::sys::fmt::DurationStyle::Span)
            ));
            st.shrank_at_ms = Some(now_ms);
            st.shrinks += 1;
            // The next step counts its own scale-down-after from here (and
            // only while the load stays low for it too).
            st.low_since_ms = Some(now_ms);
        } else {
            out.wake_at_ms = Some(due);
        }
    } else {
        st.low_since_ms = None;
    }
    st.active_wanted = (n > least).then_some(n);
    out.active = n;
    out
}

/// The app's capacity as status shows it: its keys, the active copies
/// wanted and in `roles`, and the open sessions on the copies that serve
/// (`sessions_of` a copy).
pub fn status(spec: &AppSpec, state: &AppState, roles: &[(u32, Role)], sessions_of: impl Fn(u32) -> u64) -> CapacityStatus {
    let active_wanted = state.active_wanted.unwrap_or(spec.scale.replicas).clamp(spec.scale.replicas, spec.scale.max_active());
    CapacityStatus {
        max_sessions: spec.scale.max_sessions,
        max_replicas: spec.scale.max_active(),
        scale_at: spec.scale.scale_at,
        scale_down_after_ms: spec.scale.scale_down_after_ms,
        active_wanted,
        active: roles.iter().filter(|(_, r)| *r == Role::Active).count() as u32,
        sessions: roles.iter().filter(|(_, r)| *r != Role::Draining).map(|(c, _)| sessions_of(*c)).sum(),
        capacity: spec.scale.max_sessions.map(|n| u64::from(n) * u64::from(active_wanted)),
        grew_at_ms: state.grew_at_ms,
        shrank_at_ms: state.shrank_at_ms,
        grows: state.grows,
        shrinks: state.shrinks,
    }
}

/// The line under status for an app that can grow (`max-sessions` set and
/// `max-replicas` over `replicas`), with `at` showing a time of day: `hello:
/// 4 active of at most 6 (sessions 71 of 80); grew at 10:02:11`.
pub fn note(name: &str, replicas: u32, c: &CapacityStatus, at: impl Fn(u64) -> String) -> Option<String> {
    let capacity = c.capacity.filter(|_| c.max_replicas > replicas)?;
    let mut line = format!("{name}: {} active of at most {} (sessions {} of {capacity})", c.active_wanted, c.max_replicas, c.sessions);
    let last = match (c.grew_at_ms, c.shrank_at_ms) {
        (Some(g), Some(s)) if s > g => Some(("shrank", s)),
        (Some(g), _) => Some(("grew", g)),
        (None, Some(s)) => Some(("shrank", s)),
        (None, None) => None,
    };
    if let Some((what, t)) = last {
        line.push_str(&format!("; {what} at {}", at(t)));
    }
    Some(line)
}
