//! WebSockets once upgraded: the tunnel between a visitor and a copy and
//! the pump that carries their bytes (their hand-over to the next load
//! balancer at an upgrade is `tunnel_handover.rs`, above `shared.rs`).

pub(super) mod pump;
pub(super) mod websocket;
