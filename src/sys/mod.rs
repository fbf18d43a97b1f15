//! The floor every process stands on: the operating system, read and used
//! the same way by the daemon, the load balancer, the launcher and the
//! command. Nothing here knows a process's own state or imports a process's
//! room (`serve`, `proxy`, `launcher`, `cli`, `reclaim`); nothing here
//! imports `wire` either, so the floors do not lean on each other.

pub mod cgroup;
pub mod clock;
pub mod disk;
pub mod fmt;
pub mod ids;
pub mod peer;
pub mod pidfd;
pub mod procfs;
pub mod sigpipe;
pub mod sockdiag;
pub mod spawn;
pub mod users;
