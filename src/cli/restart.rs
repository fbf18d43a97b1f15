//! `shinyctl restart APP [--now] [--wait[=TIMEOUT]]`.

use std::time::Duration;

use crate::api_client::Client;
use crate::home::Home;

/// Asks for a redeploy from the manifest as it is now; returns once the
/// release is taken, or with `wait` once the new copies serve or fail.
pub fn run(home: &Home, app: &str, now: bool, wait: Option<Duration>) -> anyhow::Result<()> {
    super::wait::print_and_follow(home, app, Client::new(home).restart(app, now)?, wait)
}
