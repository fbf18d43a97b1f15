//! Changes an operator asks for: apply and restart (a release taken, a
//! rollout), stop/start/scale/delete, reload of every manifest, and the
//! listening sockets the daemon holds for the apps' ports.

pub(super) mod deploy;
pub(super) mod operate;
pub(super) mod reload;
mod rename;
pub(super) mod sockets;
