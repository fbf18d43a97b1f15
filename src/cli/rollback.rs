//! `shinyctl rollback APP [--now]`.

use crate::api_client::Client;
use crate::home::Home;

/// Asks for the release before the current one to be redeployed; returns
/// at once.
pub fn run(home: &Home, app: &str, now: bool) -> anyhow::Result<()> {
    super::print(Client::new(home).rollback(app, now)?)
}
