//! `shinyctl restart APP [--now] [--wait[=TIMEOUT]]`.

use std::time::Duration;

use crate::home::Home;
use crate::wire::api_client::Client;

/// Asks for a redeploy from the manifest as it is now; returns once the
/// release is taken, or with `wait` once the new copies serve or fail.
pub fn run(home: &Home, app: &str, now: bool, wait: Option<Duration>) -> anyhow::Result<()> {
    super::wait::print_and_follow(home, app, Client::new(home).restart(app, now)?, wait)
}
