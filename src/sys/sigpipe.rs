//! SIGPIPE held off one thread for a while: a write to a pipe or socket
//! whose reader has gone then fails with EPIPE, which the caller handles,
//! instead of ending the process. For processes whose SIGPIPE does end
//! them on purpose (the command, so `status --watch | head` ends quietly)
//! or whose handler would (a claimed copy's init, a fork of R).

use nix::sys::signal::{pthread_sigmask, SigSet, SigmaskHow, Signal};

/// While it lives, SIGPIPE is blocked on this thread; dropped, a SIGPIPE
/// raised meanwhile is taken and the thread's mask is as it was.
pub struct Held {
    /// The thread's mask before.
    before: SigSet,
}

impl Held {
    /// Blocks SIGPIPE on this thread.
    pub fn new() -> Held {
        let mut before = SigSet::empty();
        let _ = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&SigSet::from(Signal::SIGPIPE)), Some(&mut before));
        Held { before }
    }
}

impl Default for Held {
    fn default() -> Held {
        Held::new()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if !self.before.contains(Signal::SIGPIPE) {
            let none = libc::timespec { tv_sec: 0, tv_nsec: 0 };
            // SAFETY: sigtimedwait on a live set, no info wanted, zero
            // timeout: takes a SIGPIPE pending on this thread, if any.
            unsafe { libc::sigtimedwait(SigSet::from(Signal::SIGPIPE).as_ref(), std::ptr::null_mut(), &none) };
        }
        let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&self.before), None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_write_to_a_pipe_whose_reader_went_fails_and_the_process_lives() {
        // The test harness ignores SIGPIPE anyway; the point is the write's
        // EPIPE and the thread's mask as it was.
        let (r, w) = nix::unistd::pipe().unwrap();
        drop(r);
        let mut w = std::fs::File::from(w);
        {
            let _held = Held::new();
            let e = w.write_all(b"x").unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EPIPE));
        }
        let mut now = SigSet::empty();
        pthread_sigmask(SigmaskHow::SIG_BLOCK, None, Some(&mut now)).unwrap();
        assert!(!now.contains(Signal::SIGPIPE), "the mask as it was");
    }
}
