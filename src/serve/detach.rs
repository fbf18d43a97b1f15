//! `shinyctl serve -d`: start the daemon in the background, in a session
//! of its own, and return once its API answers.

use std::time::Duration;

use crate::home::Home;
use crate::wire::api_client::Client;

use crate::wire::api_client::spawn_daemon;

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
