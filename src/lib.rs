//! shinyctl as a library: everything the binary runs, so the load balancer
//! and the daemon's pieces can be tested in-process (`tests/`). `main.rs`
//! only parses the command line and dispatches here.

pub mod cli;
pub mod home;
pub mod launcher;
pub mod logging;
pub mod manifest;
pub mod proxy;
pub mod reclaim;
pub mod reconcile;
pub mod release;
pub mod serve;
pub mod sys;
pub mod wire;
