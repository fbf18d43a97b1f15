//! `shinyctl apply -f FILE [--now] [--wait[=TIMEOUT]]`.

use std::path::Path;

use crate::home::Home;
use crate::wire::api_client::Client;
use crate::wire::ApplyRequest;

/// Reads and checks the manifest here (so a bad one starts nothing), starts
/// the daemon when it isn't running, and hands the manifest to it.
/// With `wait`, follows the deploy it started until its copies serve.
pub fn run(home: &Home, file: &Path, now: bool, wait: Option<std::time::Duration>) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(file).map_err(|e| anyhow::anyhow!("{}: cannot read the manifest: {e}", file.display()))?;
    let path = std::path::absolute(file)?;
    let req = ApplyRequest { path: path.to_string_lossy().into_owned(), text, now, keep_rollback: false };
    // Over the API's limit: said before anything else, the daemon unstarted.
    req.check_size(serde_json::to_vec(&req)?.len())?;
    let spec = crate::manifest::parse(&path, &req.text)?;
    if !Client::answers(home) {
        eprintln!("shinyctl serve is not running; starting it.");
        crate::wire::api_client::spawn_daemon(home)?;
    }
    super::wait::print_and_follow(home, &spec.name, Client::new(home).apply(&req)?, wait)
}
