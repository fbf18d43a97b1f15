//! `shinyctl stop APP`, `start APP`, `scale APP N`, `list`, `restart
//! --all` and `shutdown [--all]` (README, "Stop and start").

use std::time::{Duration, Instant};

use crate::home::Home;
use crate::wire::api_client::Client;

/// `stop` or `start` of one app.
pub fn run(home: &Home, app: &str, what: &str) -> anyhow::Result<()> {
    super::print(Client::new(home).operate(app, what)?)
}

/// `scale APP N`.
pub fn scale(home: &Home, app: &str, replicas: u32) -> anyhow::Result<()> {
    super::print(Client::new(home).scale(app, replicas)?)
}

/// `list`: the apps' names, one a line (for scripts and completion).
pub fn list(home: &Home) -> anyhow::Result<()> {
    for app in Client::new(home).status(None)?.apps {
        println!("{}", app.name);
    }
    Ok(())
}

/// `restart --all`: every app, one after the other; the first that fails
/// ends it (with `wait`, a deploy that fails too).
pub fn restart_all(home: &Home, now: bool, wait: Option<Duration>) -> anyhow::Result<()> {
    let apps = Client::new(home).status(None)?.apps;
    if apps.is_empty() {
        println!("No apps to restart.");
    }
    for app in apps {
        super::restart::run(home, &app.name, now, wait)?;
    }
    Ok(())
}

/// `shutdown [--all]`: asks the daemon to stop and returns once it has
/// (its socket no longer answers), within a minute.
pub fn shutdown(home: &Home, all: bool) -> anyhow::Result<()> {
    if !Client::answers(home) {
        println!("shinyctl serve is not running for {}.", home.root.display());
        return Ok(());
    }
    super::print(Client::new(home).shutdown(all)?)?;
    // With --all, copies that ignore SIGTERM get their 10 s grace first.
    let end = Instant::now() + Duration::from_secs(60);
    while Client::answers(home) {
        if Instant::now() > end {
            anyhow::bail!("shinyctl serve for {} still answers a minute later", home.root.display());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    println!("Stopped.");
    Ok(())
}
