//! The integration tests: the real binary, real R Shiny apps, real sockets.
//! One binary with shared helpers.

mod balancer;
mod browser;
mod command_line;
mod faults;
mod foundation;
mod helpers;
mod launcher;
mod quickstart;
mod releases;
mod several_hosts;
mod sleep;
mod staying_up;
mod upgrade;
