//! `shinyctl logs`.
use crate::home::Home;
/// Runs `logs`.
pub fn run(home: &Home, app: &str, copy: u32, follow: bool) -> anyhow::Result<()> { let _ = (home, app, copy, follow); todo!() }
