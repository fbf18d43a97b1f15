//! What the daemon's commands answer, as values: [`Done`] or a
//! [`ServeError`]. The deploys (`deploy`), the operator's commands
//! (`operate`) and the views (`status`) return these; only the API
//! (`api::answer`) turns them into HTTP replies, so the rest of the daemon
//! knows nothing of status codes.

use crate::release::RollbackError;

/// A command carried out: the message for the person who ran it, and the
/// revision a deploy started (what `--wait` follows), if it started one.
#[derive(Debug)]
pub struct Done {
    /// What the command says.
    pub message: String,
    /// The revision the deploy started; none when no copy restarts.
    pub revision: Option<u64>,
}

impl Done {
    /// A command that started no deploy.
    pub fn said(message: impl Into<String>) -> Done {
        Done { message: message.into(), revision: None }
    }

    /// A command that started a deploy at `revision`, if any.
    pub fn deployed(message: impl Into<String>, revision: Option<u64>) -> Done {
        Done { message: message.into(), revision }
    }
}

/// Why a command was refused or failed. Each message is the one the
/// command prints, whole.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// No app of that name (or it is being deleted).
    #[error("no app named {0}; see `shinyctl status` for the apps there are")]
    NoSuchApp(String),
    /// What was asked for cannot be done as given: a manifest not valid,
    /// a release that cannot be taken, a state file that cannot be written.
    #[error("{0}")]
    Invalid(String),
    /// What was asked for clashes with what the daemon has: another app's
    /// name, port, log or state file, a port that cannot be had, an app
    /// changed meanwhile.
    #[error("{0}")]
    Clash(String),
    /// No release to roll back to.
    #[error("{0}. Nothing changed.")]
    Rollback(#[from] RollbackError),
    /// registry.json could not be written.
    #[error("cannot write registry.json: {0:#}")]
    Registry(anyhow::Error),
    /// The daemon could not do its own part (a release not put in place,
    /// a task that stopped).
    #[error("{0}")]
    Failed(String),
}
