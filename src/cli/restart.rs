//! `shinyctl restart APP [--now]`.

use hyper::Method;

use crate::home::Home;

/// Asks for a redeploy from the manifest as it is now; returns once the
/// release is taken.
pub fn run(home: &Home, app: &str, now: bool) -> anyhow::Result<()> {
    let q = if now { "?now=1" } else { "" };
    super::act(home, Method::POST, &format!("/v1/apps/{app}/restart{q}"), None)
}
