//! `shinyctl restart APP [--now]`.

use crate::api_client::Client;
use crate::home::Home;

/// Asks for a redeploy from the manifest as it is now; returns once the
/// release is taken.
pub fn run(home: &Home, app: &str, now: bool) -> anyhow::Result<()> {
    super::print(Client::new(home).restart(app, now)?)
}
