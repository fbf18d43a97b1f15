//! `shinyctl delete APP [--now]`.

use hyper::Method;

use crate::home::Home;

/// Stops an app's copies and forgets it; returns at once.
pub fn run(home: &Home, app: &str, now: bool) -> anyhow::Result<()> {
    let q = if now { "?now=1" } else { "" };
    super::act(home, Method::DELETE, &format!("/v1/apps/{app}{q}"), None)
}
