//! The daemon's watches on running copies: CPU time, memory (a cgroup's
//! or the daemon's own watch) and disk past `sandbox.disk`.

pub(super) mod cpu;
pub(super) mod disk;
pub(super) mod memory;
