//! The one wall clock shinyctl reads. Everything pure (`reconcile::decide`,
//! picking by policy) takes the time as an argument instead.

/// Unix time now, in ms (0 if the clock is before 1970).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Ms on the load balancer's own monotonic clock (never 0), for how long
/// something has waited: tokio's clock, so tests that pause time see it
/// move with their timers. Its start lies an hour back, so a runtime whose
/// clock began before the first reading still counts up from it.
pub fn mono_ms() -> u64 {
    use std::sync::OnceLock;
    static START: OnceLock<std::time::Instant> = OnceLock::new();
    let start = *START.get_or_init(|| {
        let now = std::time::Instant::now();
        now.checked_sub(std::time::Duration::from_secs(3600)).unwrap_or(now)
    });
    tokio::time::Instant::now().into_std().saturating_duration_since(start).as_millis() as u64 + 1
}
