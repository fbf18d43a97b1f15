//! The daemon, `shinyctl serve` (shinyctl-api): the cycle and its I/O.

use crate::home::Home;

/// `serve -d`: starts the daemon in the background and returns once it answers.
pub fn detach(home: &Home) -> anyhow::Result<()> { let _ = home; todo!() }

/// Runs the daemon in the foreground until SIGTERM.
pub fn run(home: Home) -> anyhow::Result<()> { let _ = home; todo!() }
