//! `shinyctl rollback APP [--now] [--wait[=TIMEOUT]]`.

use std::time::Duration;

use crate::api_client::Client;
use crate::home::Home;

/// Asks for the release before the current one to be redeployed; returns
/// at once, or with `wait` once its copies serve or fail.
pub fn run(home: &Home, app: &str, now: bool, wait: Option<Duration>) -> anyhow::Result<()> {
    super::wait::print_and_follow(home, app, Client::new(home).rollback(app, now)?, wait)
}
