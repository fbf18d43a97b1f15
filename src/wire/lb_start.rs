//! What the daemon gives a load balancer it starts (`shinyctl proxy`):
//! the sticky cookie's key, which only the daemon makes (`proxy/cookie.key`,
//! [`COOKIE_KEY_LEN`] bytes), and, at an upgrade, the variable that asks
//! the new one to start beside the running one ([`TAKEOVER_ENV`]).

/// Length of the sticky cookie's key, `proxy/cookie.key`.
pub const COOKIE_KEY_LEN: usize = 32;

/// The environment variable that asks a new load balancer to start beside
/// a running one (which holds `proxy/lock`) instead of exiting.
pub const TAKEOVER_ENV: &str = "SHINYCTL_PROXY_TAKEOVER";
