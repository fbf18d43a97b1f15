//! The integration tests: the real binary, real R Shiny apps, real sockets.
//! One binary with shared helpers.

mod balancer;
mod browser;
mod foundation;
mod helpers;
mod launcher;
mod sleep;
mod staying_up;
mod upgrade;
