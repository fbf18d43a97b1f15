//! WebSockets once upgraded: the tunnel between a visitor and a copy, the
//! pump that carries their bytes, and the hand-over of open tunnels to the
//! next load balancer at an upgrade.

pub(super) mod pump;
pub(super) mod tunnel_handover;
pub(super) mod websocket;
