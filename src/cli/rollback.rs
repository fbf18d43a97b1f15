//! `shinyctl rollback APP [--to ID] [--now] [--wait[=TIMEOUT]]` and
//! `shinyctl releases APP`.

use std::time::Duration;

use crate::home::Home;
use crate::wire::api_client::Client;
use crate::wire::ReleaseRow;

/// Asks for the last release that served before the current one (or `to`)
/// to be redeployed; returns at once, or with `wait` once its copies serve
/// or fail.
pub fn run(home: &Home, app: &str, now: bool, to: Option<&str>, wait: Option<Duration>) -> anyhow::Result<()> {
    super::wait::print_and_follow(home, app, Client::new(home).rollback(app, now, to)?, wait)
}

/// `releases APP`: the kept releases, one a line, oldest deploy first.
pub fn list(home: &Home, app: &str) -> anyhow::Result<()> {
    let rows = Client::new(home).releases(app)?;
    if rows.is_empty() {
        println!("{app} keeps no release (it runs working-dir: it was deployed before releases came).");
        return Ok(());
    }
    print!("{}", table(&rows));
    Ok(())
}

/// The table `releases` prints.
pub fn table(rows: &[ReleaseRow]) -> String {
    let mut out = format!("{:<22} {:<26} {:>10}  {}\n", "RELEASE", "TAKEN", "SIZE", "STATE");
    for r in rows {
        let mut state = match r.served {
            Some(true) | None => "served".to_string(),
            Some(false) if r.current && r.failed => "failed (never ready; the release before serves)".to_string(),
            Some(false) if r.current => "starting (not ready yet)".to_string(),
            Some(false) => "failed (never ready; no rollback target)".to_string(),
        };
        if r.current {
            state = format!("current, {state}");
        }
        if !r.running.is_empty() {
            let copies: Vec<String> = r.running.iter().map(u32::to_string).collect();
            state = format!("{state}; run by copy {}", copies.join(", "));
        }
        out.push_str(&format!(
            "{:<22} {:<26} {:>10}  {state}\n",
            r.id,
            crate::sys::fmt::local_rfc3339(r.taken_ms),
            crate::sys::fmt::size(r.bytes, crate::sys::fmt::SizeStyle::Prose)
        ));
    }
    out
}
