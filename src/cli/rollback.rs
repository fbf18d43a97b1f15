//! `shinyctl rollback APP [--now]`.

use hyper::Method;

use crate::home::Home;

/// Asks for the release before the current one to be redeployed; returns
/// at once.
pub fn run(home: &Home, app: &str, now: bool) -> anyhow::Result<()> {
    let q = if now { "?now=1" } else { "" };
    super::act(home, Method::POST, &format!("/v1/apps/{app}/rollback{q}"), None)
}
