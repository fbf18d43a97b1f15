//! The policies a manifest names, as values the rest of shinyctl uses:
//! `lb-policy` ([`LbPolicy`], carried in the copies table to the load
//! balancer) and `restart-policy` ([`RestartPolicy`], read by
//! `reconcile::decide`). Their serde derives are for the records and the
//! table (kebab-case, as in the manifest), not for reading the manifest.

use serde::{Deserialize, Serialize};

/// How the load balancer picks a copy for a visitor who has none yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum LbPolicy {
    /// The copy with the fewest open connections.
    #[default]
    LeastConn,
    /// Each active copy in turn.
    RoundRobin,
    /// Any active copy.
    Random,
    /// Always the oldest active copy.
    First,
}

impl LbPolicy {
    /// Every accepted spelling, for error messages.
    pub const ALLOWED: &'static str = "least-conn, round-robin, random, first";

    /// Parses the manifest spelling.
    pub fn parse(s: &str) -> Option<LbPolicy> {
        match s {
            "least-conn" => Some(LbPolicy::LeastConn),
            "round-robin" => Some(LbPolicy::RoundRobin),
            "random" => Some(LbPolicy::Random),
            "first" => Some(LbPolicy::First),
            _ => None,
        }
    }
}

/// Whether a copy that exited comes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum RestartPolicy {
    /// After any exit.
    #[default]
    Always,
    /// Only after a non-zero exit (or a signal).
    OnFailure,
    /// Never.
    Never,
}

impl RestartPolicy {
    /// Every accepted spelling, for error messages.
    pub const ALLOWED: &'static str = "always, on-failure, never";

    /// Parses the manifest spelling.
    pub fn parse(s: &str) -> Option<RestartPolicy> {
        match s {
            "always" => Some(RestartPolicy::Always),
            "on-failure" => Some(RestartPolicy::OnFailure),
            "never" => Some(RestartPolicy::Never),
            _ => None,
        }
    }

    /// The manifest spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            RestartPolicy::Always => "always",
            RestartPolicy::OnFailure => "on-failure",
            RestartPolicy::Never => "never",
        }
    }
}
