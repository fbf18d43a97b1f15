//! The daemon's copies as processes: starting and stopping them (`act`),
//! the cycle that observes, decides and acts, what an exit means, the
//! copies it adopts after a restart, the readiness probe, the stops that
//! wait for answers to drain, the restart tallies, the cgroups a copy
//! starts in, the memory bound on growth, and the pool's zygotes.

pub(super) mod act;
pub(super) mod copy_cgroups;
pub(super) mod copy_end;
pub(super) mod cycle;
pub(super) mod memory_bound;
pub(super) mod orphans;
pub(super) mod probe;
pub(super) mod stops;
pub(super) mod tallies;
pub(super) mod zygote_pool;
