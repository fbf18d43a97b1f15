//! The signals the launcher, its init and the zygote's fork wait for and
//! forward to R.

use nix::sys::signal::{SigSet, SigmaskHow, Signal};

/// The signals the launcher and the init wait for: the three forwarded to
/// R, and SIGCHLD.
pub fn forwarded_signals() -> SigSet {
    let mut set = SigSet::empty();
    for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP, Signal::SIGCHLD] {
        set.add(s);
    }
    set
}

/// Blocks [`forwarded_signals`], to be taken with sigwait.
pub fn block_signals() {
    let _ = nix::sys::signal::sigprocmask(SigmaskHow::SIG_BLOCK, Some(&forwarded_signals()), None);
}

/// Unblocks every signal (before exec: R starts with none blocked).
pub fn unblock_signals() {
    let _ = nix::sys::signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None);
}
