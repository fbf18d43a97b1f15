//! The `source` field of the load balancer's error log lines.

/// Which side of the load balancer an error came from, for the logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorSource {
    /// A copy (connect, send, its answer).
    Upstream,
    /// A visitor (its connection, its request).
    Downstream,
}

impl std::fmt::Display for ErrorSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ErrorSource::Upstream => "upstream",
            ErrorSource::Downstream => "downstream",
        })
    }
}
