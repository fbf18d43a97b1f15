//! The command: one file per subcommand. It only talks to the API.

pub mod apply;
pub mod delete;
pub mod logs;
pub mod restart;
pub mod status;
