//! The copies' processes, watched by the load balancer itself: the moment
//! one exits, its copy is marked gone, so no visitor is sent to its port
//! again. While the daemon is down no new table comes, and another program
//! may start listening on a dead copy's old port; this keeps that program
//! from getting the copy's visitors (they go to a stand-in, as when a copy
//! refuses). A pidfd per copy where the kernel gives one; otherwise its
//! `/proc` entry is polled.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::unix::AsyncFd;

use crate::proxy::copies::copy_state::CopyState;
use crate::proxy::copies::table::Table;
use crate::sys::pidfd::Pidfd;
use crate::sys::procfs;

/// How often a copy's process is looked for when no pidfd can be had.
const POLL: Duration = Duration::from_millis(500);

/// Starts a watcher for each copy of `table` not watched yet.
pub fn watch(table: &Table) {
    for app in &table.apps {
        for c in &app.copies {
            if c.pid != 0 && !c.state.watched.swap(true, Ordering::Relaxed) {
                tokio::spawn(watch_one(app.name.clone(), c.copy, c.pid, c.state.clone()));
            }
        }
    }
}

/// Waits for the process to exit, then marks the copy gone.
async fn watch_one(app: String, copy: u32, pid: u32, state: Arc<CopyState>) {
    match Pidfd::open(pid, None) {
        // SAFETY: the AsyncFd owns the OwnedFd, which stays open and the
        // same until the AsyncFd drops. A pidfd turns readable when the
        // process exits.
        Ok(h) => match unsafe { AsyncFd::register_with_interest(h.fd, tokio::io::Interest::READABLE) } {
            Ok(afd) => drop(afd.readable().await),
            Err(_) => poll_gone(pid).await,
        },
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
        Err(_) => poll_gone(pid).await,
    }
    state.gone.store(true, Ordering::Relaxed);
    tracing::info!(app, copy, pid, "copy {copy}'s process {pid} is gone; no visitor goes to its port until the daemon says otherwise");
}

/// Returns once `pid` no longer runs (gone or a zombie).
async fn poll_gone(pid: u32) {
    let Some(start) = procfs::start_ticks(pid) else { return };
    while procfs::is_alive(pid, start) {
        tokio::time::sleep(POLL).await;
    }
}
