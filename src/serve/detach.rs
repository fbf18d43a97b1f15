//! `shinyctl serve -d`: start the daemon in the background, in a session
//! of its own, and return once its API answers.

use std::time::Duration;

use crate::home::Home;
use crate::wire::api_client::Client;

use super::act;

/// `serve -d`: starts `shinyctl serve` in its own session and returns once
/// its API answers.
pub fn detach(home: &Home) -> anyhow::Result<()> {
    // A daemon that answers may be one just told to stop (the documented
    // upgrade is `pkill … && shinyctl serve -d`): give it a second to go.
    let deadline = std::time::Instant::now() + Duration::from_secs(1);
    while Client::answers(home) {
        if std::time::Instant::now() >= deadline {
            println!("shinyctl serve is already running ({}).", home.api_sock().display());
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    spawn_daemon(home)?;
    println!("shinyctl serve started; it answers on {}.", home.api_sock().display());
    Ok(())
}

/// Starts the daemon in the background (its command line is exactly
/// `…/shinyctl serve`) and waits until its API answers.
pub fn spawn_daemon(home: &Home) -> anyhow::Result<()> {
    home.ensure()?;
    let mut child = act::spawn_self(home, "serve", &[])?;
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while std::time::Instant::now() < deadline {
        if Client::answers(home) {
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            anyhow::bail!("shinyctl serve exited at start ({status}); see {}", home.api_log().display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    anyhow::bail!("shinyctl serve did not answer within 15 s; see {}", home.api_log().display())
}
