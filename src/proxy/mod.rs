//! The load balancer: `shinyctl proxy`.

use crate::home::Home;

/// Runs the load balancer until it is told to stop.
pub fn run(home: Home) -> anyhow::Result<()> {
    let _ = home;
    anyhow::bail!("not built yet")
}
