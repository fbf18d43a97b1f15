//! The log level of the daemon and the load balancer, from `SHINYCTL_LOG`:
//! a level (`debug`), or a level per module with an optional default
//! (`info,shinyctl::proxy=debug`), as tracing-subscriber's [`Targets`]
//! reads it. Unset, it is `info`.

use std::str::FromStr;

use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::{SubscriberInitExt, TryInitError};

/// The variable that sets the log level.
pub const LOG_ENV: &str = "SHINYCTL_LOG";

/// Why a value of `SHINYCTL_LOG` is not used (the process says it in its
/// log and logs at info).
#[derive(Debug, thiserror::Error)]
pub enum BadLogLevel {
    /// A bare word that is no level (Targets would read it as a module).
    #[error("{LOG_ENV}={value}: {word} is not a level (off, error, warn, info, debug, trace); logging at info")]
    NotALevel {
        /// The variable's value.
        value: String,
        /// The word that is no level.
        word: String,
    },
    /// A value tracing's filter cannot read.
    #[error("{LOG_ENV}={value}: {why}; logging at info")]
    Unreadable {
        /// The variable's value.
        value: String,
        /// What the filter said.
        why: String,
    },
}

/// The filter a value of `SHINYCTL_LOG` gives: `info` when unset or blank;
/// an error (for the caller to report) when it is no level or list of
/// levels.
pub fn targets(value: Option<&str>) -> Result<Targets, BadLogLevel> {
    match value.map(str::trim) {
        None | Some("") => Ok(Targets::new().with_default(LevelFilter::INFO)),
        Some(v) => {
            // Targets reads a bare word as a module to log in full (and
            // nothing else): a misspelt level would silence the log.
            if let Some(word) = v.split(',').map(str::trim).find(|d| !d.contains('=') && LevelFilter::from_str(d).is_err()) {
                return Err(BadLogLevel::NotALevel { value: v.to_string(), word: word.to_string() });
            }
            Targets::from_str(v).map_err(|e| BadLogLevel::Unreadable { value: v.to_string(), why: e.to_string() })
        }
    }
}

/// Sets the process's logger: plain lines (no colours) to `writer`, at the
/// level `SHINYCTL_LOG` sets; `show_target` adds the module to each line.
/// A value it cannot read is said in the log, and `info` is used.
pub fn init<W>(writer: W, show_target: bool) -> Result<(), TryInitError>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let value = std::env::var(LOG_ENV).ok();
    let (filter, complaint) = match targets(value.as_deref()) {
        Ok(t) => (t, None),
        Err(why) => (Targets::new().with_default(LevelFilter::INFO), Some(why)),
    };
    // The fmt layer lets everything through; the filter decides.
    tracing_subscriber::fmt()
        .with_writer(writer)
        .with_ansi(false)
        .with_target(show_target)
        .with_max_level(LevelFilter::TRACE)
        .finish()
        .with(filter)
        .try_init()?;
    if let Some(why) = complaint {
        tracing::warn!("{why}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::Level;

    #[test]
    fn unset_is_info() {
        let t = targets(None).unwrap();
        assert!(t.would_enable("shinyctl::serve", &Level::INFO));
        assert!(!t.would_enable("shinyctl::serve", &Level::DEBUG));
        assert!(!targets(Some(" ")).unwrap().would_enable("x", &Level::DEBUG));
    }

    #[test]
    fn a_level_and_a_level_per_module_are_read() {
        assert!(targets(Some("debug")).unwrap().would_enable("shinyctl::proxy::requests::forward", &Level::DEBUG));
        let t = targets(Some("warn,shinyctl::proxy=debug")).unwrap();
        assert!(t.would_enable("shinyctl::proxy::requests::forward", &Level::DEBUG));
        assert!(!t.would_enable("shinyctl::serve::copies::cycle", &Level::INFO));
        assert!(t.would_enable("shinyctl::serve::copies::cycle", &Level::WARN));
    }

    #[test]
    fn nonsense_is_refused_with_the_variable_named() {
        let err = targets(Some("loud")).unwrap_err().to_string();
        assert!(err.starts_with("SHINYCTL_LOG=loud: loud is not a level"), "{err}");
        let err = targets(Some("info,shinyctl=loud")).unwrap_err().to_string();
        assert!(err.starts_with("SHINYCTL_LOG=info,shinyctl=loud: "), "{err}");
    }
}
