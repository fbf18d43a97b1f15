//! `shinyctl apply`.
use crate::home::Home;
use std::path::Path;
/// Runs `apply`.
pub fn run(home: &Home, file: &Path, now: bool) -> anyhow::Result<()> { let _ = (home, file, now); todo!() }
