//! `--wait[=TIMEOUT]` of `apply`, `restart` and `rollback` (README,
//! "Deploys that tell the truth"): after the command's answer, follows the
//! deploy it started, printing each change of its progress, and returns
//! once its copies serve, or an error with the copy's last error and its
//! log once one fails or the time is up (the version before still serves).

use std::time::{Duration, Instant};

use crate::home::Home;
use crate::wire::api_client::Client;
use crate::wire::{ActionReply, RolloutState};

/// How long `--wait` waits when no TIMEOUT is given.
pub const DEFAULT_TIMEOUT: &str = "5m";
/// How often the deploy is looked at.
const POLL: Duration = Duration::from_millis(250);

/// Parses `--wait`'s TIMEOUT (a duration as the manifest writes them); a
/// bad one is a usage error (exit status 2), as clap reports it.
pub fn timeout(s: &str) -> Result<Duration, String> {
    crate::manifest::parse_duration(s).map(Duration::from_millis).ok_or_else(|| "not a duration; write it like 90s, 5m or 1h".to_string())
}

/// Prints the command's answer; with `wait`, follows the deploy it started
/// until it serves, fails, or `wait` runs out.
pub fn print_and_follow(home: &Home, app: &str, reply: ActionReply, wait: Option<Duration>) -> anyhow::Result<()> {
    println!("{}", reply.message);
    let Some(limit) = wait else { return Ok(()) };
    let Some(revision) = reply.revision else {
        println!("{app}: nothing to wait for: no copy restarts.");
        return Ok(());
    };
    let client = Client::new(home);
    let end = Instant::now() + limit;
    let mut said = String::new();
    loop {
        let now = client.rollout(app, revision)?;
        if now.message != said {
            println!("{app}: {}", now.message);
            said = now.message.clone();
        }
        // What visitors get meanwhile (a daemon before `before_serves`
        // always had a version before to say so of).
        let before = match now.before_serves {
            Some(false) => format!("no version of {app} serves"),
            _ => "the version before still serves".to_string(),
        };
        match now.state {
            RolloutState::Serving => return Ok(()),
            RolloutState::Failed => anyhow::bail!("{app}: the deploy failed; {before}.{}", last_error(&client, app)),
            RolloutState::Starting if Instant::now() >= end => anyhow::bail!(
                "{app}: revision {revision} did not serve within {}; {before}.{}",
                crate::sys::fmt::duration(limit, crate::sys::fmt::DurationStyle::Span),
                last_error(&client, app)
            ),
            RolloutState::Starting => std::thread::sleep(POLL),
        }
    }
}

/// The lines status prints under its table for the app (the copy's last
/// error and its log's path among them), as a block to add to an error.
fn last_error(client: &Client, app: &str) -> String {
    let notes: Vec<String> = client.status(Some(app)).map(|s| s.apps.into_iter().flat_map(|a| a.notes).collect()).unwrap_or_default();
    notes.iter().map(|n| format!("\n  {n}")).collect()
}
