//! `shinyctl delete APP [--now]`.

use crate::home::Home;
use crate::wire::api_client::Client;

/// Stops an app's copies and forgets it; returns at once.
pub fn run(home: &Home, app: &str, now: bool) -> anyhow::Result<()> {
    super::print(Client::new(home).delete(app, now)?)
}
