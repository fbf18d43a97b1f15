//! The one wall clock shinyctl reads. Everything pure (`reconcile::decide`,
//! picking by policy) takes the time as an argument instead.

/// Unix time now, in ms (0 if the clock is before 1970).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}
