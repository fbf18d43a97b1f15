//! `shinyctl restart`.
use crate::home::Home;
/// Runs `restart`.
pub fn run(home: &Home, app: &str, now: bool) -> anyhow::Result<()> { let _ = (home, app, now); todo!() }
