//! The integration tests: the real binary, real R Shiny apps, real sockets.
//! One binary with shared helpers.

mod balancer;
mod browser;
mod capacity;
mod chaos;
mod command_line;
mod control_sockets;
mod disk;
mod faults;
mod fence;
mod fence_filter;
mod fence_inside;
mod foundation;
mod helpers;
mod hostile;
mod identity;
mod launcher;
mod limits;
mod listeners;
mod logs;
mod metrics;
mod operator;
mod pool;
mod quickstart;
mod releases;
mod several_hosts;
mod sleep;
mod staying_up;
mod systemd;
mod tunnels;
mod upgrade;
