//! `shinyctl delete`.
use crate::home::Home;
/// Runs `delete`.
pub fn run(home: &Home, app: &str, now: bool) -> anyhow::Result<()> { let _ = (home, app, now); todo!() }
