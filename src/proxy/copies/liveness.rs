//! The copies' processes, watched by the load balancer itself: the moment
//! one begins to exit, its copy is marked gone, so no visitor is sent to
//! its port again and the requests it was answering go to another copy.
//! While the daemon is down no new table comes, and another program may
//! start listening on a dead copy's old port; this keeps that program from
//! getting the copy's visitors (they go to a stand-in, as when a copy
//! refuses). A pidfd per copy where the kernel gives one; otherwise its
//! `/proc` entry is polled.
//!
//! A process that is killed frees its memory before it closes its sockets
//! and before its pidfd turns readable: 13-30 ms for an R with shiny,
//! during which a request on it waits for nothing. Its other threads end
//! first (within a millisecond or so of the signal): a pidfd for each
//! (`PIDFD_THREAD`, Linux 6.9) tells the load balancer then, and the main
//! thread's state tells a process on its way out from a thread that ended
//! on its own. README, "Staying up" (failover).

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::unix::AsyncFd;

use crate::proxy::copies::copy_state::CopyState;
use crate::proxy::copies::table::Table;
use crate::sys::pidfd::Pidfd;
use crate::sys::procfs;

/// How often a copy's process is looked for when no pidfd can be had.
const POLL: Duration = Duration::from_millis(500);

/// When a copy's process is looked at for threads to watch, while fewer
/// than [`THREADS_WATCHED`] are: at first after this, then twice as long
/// each time up to [`THREAD_LOOK_MOST`]; and again from the start when it
/// first answers. R starts threads as it serves (a copy from the pool has
/// only its main thread until then).
const THREAD_LOOK_FIRST: Duration = Duration::from_millis(100);
/// The longest wait between two looks for threads.
const THREAD_LOOK_MOST: Duration = Duration::from_secs(10);

/// Threads watched per copy: the first to end tells, so two are plenty,
/// and an app with dozens (OpenMP, arrow) costs the load balancer no more
/// descriptors than one with two.
const THREADS_WATCHED: usize = 2;

/// Starts a watcher for each copy of `table` not watched yet.
pub fn watch(table: &Table) {
    for app in &table.apps {
        for c in &app.copies {
            if c.pid != 0 && !c.state.watched.swap(true, Ordering::Relaxed) {
                tokio::spawn(watch_one(app.name.clone(), c.copy, (c.pid, c.r_pid.unwrap_or(c.pid)), c.state.clone()));
            }
        }
    }
}

/// Waits for the copy's process `pid` to exit, then marks the copy gone
/// (unless the end of a thread of its R, `r`, told first), watching R's
/// other threads meanwhile.
async fn watch_one(app: String, copy: u32, (pid, r): (u32, u32), state: Arc<CopyState>) {
    let mut exited = std::pin::pin!(exit_of(pid));
    let mut threads = Threads { app: app.clone(), copy, pid: r, seen: HashSet::new(), watching: Arc::new(AtomicUsize::new(0)) };
    threads.look(&state);
    let mut wait = THREAD_LOOK_FIRST;
    loop {
        let wanted = threads.wanted();
        tokio::select! {
            () = &mut exited => break,
            () = state.first_answer.notified(), if wanted => {
                threads.look(&state);
                wait = THREAD_LOOK_FIRST;
            }
            () = tokio::time::sleep(wait), if wanted => {
                threads.look(&state);
                wait = (wait * 2).min(THREAD_LOOK_MOST);
            }
        }
    }
    if state.gone.load(Ordering::Relaxed) {
        return;
    }
    state.mark_gone();
    tracing::info!(app, copy, pid, "copy {copy}'s process {pid} is gone; no visitor goes to its port until the daemon says otherwise");
}

/// Returns once process `pid` has exited: on its pidfd, else polled.
async fn exit_of(pid: u32) {
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
}

/// The threads of a copy's process that are watched.
struct Threads {
    app: String,
    copy: u32,
    /// The process.
    pid: u32,
    /// Every thread watched so far, ended or not.
    seen: HashSet<u32>,
    /// Threads watched now.
    watching: Arc<AtomicUsize>,
}

impl Threads {
    /// True while fewer than [`THREADS_WATCHED`] are watched.
    fn wanted(&self) -> bool {
        self.watching.load(Ordering::Relaxed) < THREADS_WATCHED
    }

    /// Starts watching threads of the process not seen before, up to
    /// [`THREADS_WATCHED`].
    fn look(&mut self, state: &Arc<CopyState>) {
        let mut started = Vec::new();
        for tid in procfs::other_threads(self.pid) {
            if !self.wanted() || !self.seen.insert(tid) {
                continue;
            }
            if let Ok(fd) = Pidfd::open_thread(tid) {
                self.watching.fetch_add(1, Ordering::Relaxed);
                let thread = Thread { app: self.app.clone(), copy: self.copy, pid: self.pid, tid, watching: self.watching.clone() };
                tokio::spawn(thread.watch(fd, state.clone()));
                started.push(tid);
            }
        }
        if !started.is_empty() {
            let (app, copy, pid) = (&self.app, self.copy, self.pid);
            tracing::info!(
                app,
                copy,
                pid,
                "copy {copy}'s process {pid}: its threads {started:?} watched, whose end tells the process's before its sockets close"
            );
        }
    }
}

/// One watched thread of a copy's process.
struct Thread {
    app: String,
    copy: u32,
    /// The process.
    pid: u32,
    /// The thread.
    tid: u32,
    /// Threads of the process watched now; this one counts until it ends.
    watching: Arc<AtomicUsize>,
}

impl Thread {
    /// Waits for the thread to end; when the process is ending with it,
    /// marks the copy gone.
    async fn watch(self, fd: Pidfd, state: Arc<CopyState>) {
        // SAFETY: as in exit_of; a thread's pidfd turns readable when the
        // thread exits.
        if let Ok(afd) = unsafe { AsyncFd::register_with_interest(fd.fd, tokio::io::Interest::READABLE) } {
            drop(afd.readable().await);
            self.ended(&state).await;
        }
        self.watching.fetch_sub(1, Ordering::Relaxed);
    }

    /// The thread ended: was it the process's end?
    async fn ended(&self, state: &CopyState) {
        let Thread { app, copy, pid, tid, .. } = self;
        // The main thread takes its SIGKILL a moment after the others:
        // looked at twice, so the instant between taking it and beginning
        // to exit (when neither shows) is not taken for a thread that
        // ended alone.
        for look in 0..2 {
            if state.gone.load(Ordering::Relaxed) {
                return;
            }
            if procfs::is_ending(*pid) {
                state.mark_gone();
                tracing::info!(
                    app,
                    copy,
                    pid,
                    tid,
                    "copy {copy}'s process {pid} is ending (its thread {tid} ended); its requests go to another copy"
                );
                return;
            }
            if look == 0 {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    }
}

/// Returns once `pid` no longer runs (gone or a zombie).
async fn poll_gone(pid: u32) {
    let Some(start) = procfs::start_ticks(pid) else { return };
    while procfs::is_alive(pid, start) {
        tokio::time::sleep(POLL).await;
    }
}
