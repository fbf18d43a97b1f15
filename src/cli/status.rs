//! `shinyctl status`.
use crate::home::Home;
/// Runs `status`.
pub fn run(home: &Home, app: Option<&str>, json: bool) -> anyhow::Result<()> { let _ = (home, app, json); todo!() }
