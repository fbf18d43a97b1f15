//! Every protocol between shinyctl's processes, as plain data and the code
//! that reads and writes it on the wire: the API of `api.sock` (its request
//! and reply types, the typed client), HTTP/JSON over Unix sockets, the
//! copies table and the statistics on `proxy/proxy.sock`, the handover of
//! sockets between the daemon and the load balancers, the launcher's
//! arguments and its report, and the records of `state.json` and
//! `registry.json`. Both ends of each protocol import it from here, so no
//! process imports another's room (ARCHITECTURE.md, "The map"). It stands
//! on `sys`, `manifest` and `home` only.

pub mod api;
pub mod api_client;
pub mod handover;
pub mod launch;
pub mod lb_start;
pub mod reclaim;
pub mod request;
pub mod state;
pub mod stats;
pub mod table;
pub mod uds;

pub use api::*;
pub use state::*;
pub use stats::*;
pub use table::*;

/// The build identity of this binary (the version and a hash of its
/// sources): a load balancer of another build is replaced on upgrade.
pub const BUILD: &str = concat!(env!("CARGO_PKG_VERSION"), "+", env!("SHINYCTL_BUILD_ID"));
