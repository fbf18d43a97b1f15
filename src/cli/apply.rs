//! `shinyctl apply -f FILE [--now] [--wait[=TIMEOUT]]`.

use std::path::Path;

use crate::api_client::Client;
use crate::home::Home;
use crate::model::ApplyRequest;

/// Reads and checks the manifest here (so a bad one starts nothing), starts
/// the daemon when it isn't running, and hands the manifest to it.
/// With `wait`, follows the deploy it started until its copies serve.
pub fn run(home: &Home, file: &Path, now: bool, wait: Option<std::time::Duration>) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(file).map_err(|e| anyhow::anyhow!("{}: cannot read the manifest: {e}", file.display()))?;
    let path = std::path::absolute(file)?;
    let spec = crate::manifest::parse(&path, &text)?;
    if !Client::answers(home) {
        eprintln!("shinyctl serve is not running; starting it.");
        crate::serve::spawn_daemon(home)?;
    }
    let req = ApplyRequest { path: path.to_string_lossy().into_owned(), text, now };
    super::wait::print_and_follow(home, &spec.name, Client::new(home).apply(&req)?, wait)
}
