//! The command: one file per subcommand. It only talks to the API, through
//! [`crate::wire::api_client::Client`].

pub mod apply;
pub mod completions;
pub mod delete;
pub mod logs;
pub mod man;
pub mod operate;
pub mod reload;
pub mod restart;
pub mod rollback;
pub mod status;
pub mod wait;

use crate::wire::ActionReply;

/// Prints the message of a route that changed something.
fn print(reply: ActionReply) -> anyhow::Result<()> {
    println!("{}", reply.message);
    Ok(())
}
