//! The command: one file per subcommand. It only talks to the API.

pub mod apply;
pub mod delete;
pub mod logs;
pub mod restart;
pub mod rollback;
pub mod status;

use std::time::Duration;

use bytes::Bytes;
use hyper::Method;

use crate::home::Home;
use crate::model::{ActionReply, ApiError};

/// Calls the API and returns the body of a 2xx answer; any other answer
/// becomes an error carrying the daemon's message.
pub fn call(home: &Home, method: Method, path: &str, body: Option<Vec<u8>>) -> anyhow::Result<Bytes> {
    let sock = home.api_sock();
    let (status, bytes) = crate::uds::request_blocking(&sock, method, path, body, Duration::from_secs(30)).map_err(|_| {
        anyhow::anyhow!(
            "shinyctl serve is not running (nothing answers on {}). Start it with `shinyctl serve -d`; `shinyctl apply` starts it too.",
            sock.display()
        )
    })?;
    if status.is_success() {
        return Ok(bytes);
    }
    match serde_json::from_slice::<ApiError>(&bytes) {
        Ok(e) => anyhow::bail!("{}", e.error),
        Err(_) => anyhow::bail!("shinyctl serve answered {status}: {}", String::from_utf8_lossy(&bytes)),
    }
}

/// Calls an API route that changes something, and prints its message.
pub fn act(home: &Home, method: Method, path: &str, body: Option<Vec<u8>>) -> anyhow::Result<()> {
    let bytes = call(home, method, path, body)?;
    let reply: ActionReply = serde_json::from_slice(&bytes)?;
    println!("{}", reply.message);
    Ok(())
}
