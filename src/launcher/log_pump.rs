//! The copy's output reaches its log through a pipe the launcher reads
//! (README, "Logs"), never as the log file itself: a descriptor of the file
//! in R's hands could be truncated to nothing (shinyctl's own lines with
//! it) or stretched to a sparse file of any size, which rotation would
//! then copy as real zeros onto the host's disk. The launcher holds the
//! file; R, the init and everything R starts get the pipe's write end as
//! their standard output and error.
//!
//! The pump bounds what the log can take: past [`LOG_MAX_BYTES`] (twice
//! the size at which the daemon rotates, so a daemon that is down or a copy
//! writing faster than the daemon looks does not fill the disk) it drops
//! the copy's output and, once the log is rotated, writes a line saying how
//! much; and it ends a line longer than [`LINE_MAX_BYTES`] there (as
//! journald does), so a copy's one huge line never has to be read whole.
//!
//! The launcher forks (the copy's R, the init) as a single-threaded
//! process, so the pump's thread starts only after the last fork
//! ([`start`]); until then what is written waits in the pipe.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{mpsc, Mutex};
use std::time::Duration;

/// Past this size the copy's output is dropped until the daemon rotates
/// the log (it rotates at `LOG_ROTATE_BYTES`, every few seconds).
pub const LOG_MAX_BYTES: u64 = 2 * crate::wire::launch::LOG_ROTATE_BYTES;

/// A line longer than this is ended there; the rest is the next line.
pub const LINE_MAX_BYTES: usize = 64 * 1024;

/// How long a launcher that ends gives the pump to write the copy's last
/// output.
pub const FINISH_WAIT: Duration = Duration::from_millis(500);

/// The pipe's read end and the log file, between [`install`] and [`start`];
/// then the receiver that hears the pump end.
static PUMP: Mutex<Option<State>> = Mutex::new(None);

/// Where the pump is.
enum State {
    /// Installed, not started: the read end and the log.
    Waiting(OwnedFd, File),
    /// Started: says when the pump has ended.
    Running(mpsc::Receiver<()>),
}

/// Puts a pipe between this process's standard output and error (the
/// copy's log, as the daemon gave it) and everything written to them: the
/// launcher's own lines, and the init's and R's, which inherit the pipe.
/// Without a pipe the output goes to the log directly, as it did.
pub fn install() {
    let (read, write) = match nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) {
        Ok(p) => p,
        Err(e) => return note(&format!("--- shinyctl: no pipe for the copy's output ({e}); it writes to its log directly ---")),
    };
    // SAFETY: fcntl(F_DUPFD_CLOEXEC) on fd 2, which the daemon opened.
    let log = unsafe { libc::fcntl(2, libc::F_DUPFD_CLOEXEC, 3) };
    if log < 0 {
        return note(&format!("--- shinyctl: cannot keep the log ({}); the copy writes to it directly ---", io::Error::last_os_error()));
    }
    // SAFETY: a new descriptor this process owns from here on.
    let log = unsafe { File::from_raw_fd(log) };
    for fd in [1, 2] {
        // SAFETY: dup2 of a live pipe end onto the standard descriptors;
        // dup2 leaves the copies without close-on-exec, so they are inherited.
        unsafe { libc::dup2(write.as_raw_fd(), fd) };
    }
    drop(write);
    *PUMP.lock().unwrap_or_else(|e| e.into_inner()) = Some(State::Waiting(read, log));
}

/// Starts the pump's thread (once). Only after the launcher's last fork of
/// its own. Every signal is blocked in it, so the launcher's forwarded
/// signals keep going to the thread that waits for them.
pub fn start() {
    let mut state = PUMP.lock().unwrap_or_else(|e| e.into_inner());
    let Some(State::Waiting(..)) = state.as_ref() else { return };
    let Some(State::Waiting(read, log)) = state.take() else { return };
    let (done, ended) = mpsc::channel();
    let all = nix::sys::signal::SigSet::all();
    let mut old = nix::sys::signal::SigSet::empty();
    let _ = nix::sys::signal::pthread_sigmask(nix::sys::signal::SigmaskHow::SIG_BLOCK, Some(&all), Some(&mut old));
    let spawned = std::thread::Builder::new().name("log-pump".into()).spawn(move || {
        let mut log = log;
        pump(File::from(read), &mut log, LOG_MAX_BYTES, LINE_MAX_BYTES);
        let _ = done.send(());
    });
    let _ = nix::sys::signal::pthread_sigmask(nix::sys::signal::SigmaskHow::SIG_SETMASK, Some(&old), None);
    match spawned {
        Ok(_) => *state = Some(State::Running(ended)),
        Err(e) => note(&format!("--- shinyctl: no thread for the copy's output ({e}) ---")),
    }
}

/// Before the launcher ends: lets go of its own ends of the pipe and gives
/// the pump up to `wait` to write what the copy wrote last (R's last words
/// when it fails). A pump never started drains what waits in the pipe here.
/// Something the copy started that still holds the pipe keeps it open; the
/// launcher ends without waiting longer for it.
pub fn finish(wait: Duration) {
    let state = PUMP.lock().unwrap_or_else(|e| e.into_inner()).take();
    let Some(state) = state else { return };
    if let Ok(null) = File::options().write(true).open("/dev/null") {
        for fd in [1, 2] {
            // SAFETY: dup2 of /dev/null onto the standard descriptors.
            unsafe { libc::dup2(null.as_raw_fd(), fd) };
        }
    }
    match state {
        State::Running(ended) => {
            let _ = ended.recv_timeout(wait);
        }
        State::Waiting(read, mut log) => {
            // Nothing else reads it: take what is there now, without waiting.
            let _ = nix::fcntl::fcntl(read.as_raw_fd(), nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK));
            pump(File::from(read), &mut log, LOG_MAX_BYTES, LINE_MAX_BYTES);
        }
    }
}

/// Copies `from` into `log` until the pipe ends (or, non-blocking, is empty).
/// A read error other than an interruption ends it too.
pub fn pump(mut from: File, log: &mut File, max: u64, line_max: usize) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut bounds = Bounds { max, line_max, line: 0, dropped: 0 };
    loop {
        match from.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => bounds.take(&buf[..n], log),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

/// What the pump keeps between reads: the bounds (above) and where it is
/// against them.
struct Bounds {
    /// The log's most, in bytes.
    max: u64,
    /// A line's most, in bytes.
    line_max: usize,
    /// The length of the line still open at the end of the last read.
    line: usize,
    /// Bytes dropped since the log passed `max`, not yet said.
    dropped: u64,
}

impl Bounds {
    /// Writes one read's bytes to the log, or drops them while it is past
    /// its most. A write that fails (a full disk) loses those bytes, never
    /// the copy: the pipe is always read.
    fn take(&mut self, chunk: &[u8], log: &mut File) {
        if log.metadata().map_or(0, |m| m.len()) > self.max {
            self.dropped += chunk.len() as u64;
            return;
        }
        if self.dropped > 0 {
            let _ = writeln!(
                log,
                "{}--- shinyctl: {} bytes of the copy's output dropped: its log passed {} bytes before it was rotated ---",
                if self.line > 0 { "\n" } else { "" },
                self.dropped,
                self.max
            );
            (self.dropped, self.line) = (0, 0);
        }
        let _ = log.write_all(&split_long_lines(chunk, &mut self.line, self.line_max));
    }
}

/// `chunk` with a newline put in wherever a line would pass `line_max`
/// bytes; `line` carries the length of the line open at the chunk's end.
fn split_long_lines<'a>(chunk: &'a [u8], line: &mut usize, line_max: usize) -> std::borrow::Cow<'a, [u8]> {
    let mut out: Option<Vec<u8>> = None;
    for (i, &b) in chunk.iter().enumerate() {
        if b == b'\n' {
            *line = 0;
        } else if *line == line_max {
            out.get_or_insert_with(|| chunk[..i].to_vec()).push(b'\n');
            *line = 1;
        } else {
            *line += 1;
        }
        if let Some(o) = out.as_mut() {
            o.push(b);
        }
    }
    out.map_or(std::borrow::Cow::Borrowed(chunk), std::borrow::Cow::Owned)
}

/// In a process forked from the launcher (the init, the process that
/// becomes R): closes the log and the pipe's read end, which are the
/// launcher's alone.
pub fn forget() {
    drop(PUMP.lock().unwrap_or_else(|e| e.into_inner()).take());
}

/// A line straight to the log (fd 2), for when there is no pump.
fn note(line: &str) {
    let _ = writeln!(io::stderr(), "{line}");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pipe() -> (File, File) {
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        (File::from(r), File::from(w))
    }

    fn log_file(dir: &std::path::Path) -> (File, std::path::PathBuf) {
        let path = dir.join("copy.log");
        (File::options().create(true).append(true).open(&path).unwrap(), path)
    }

    #[test]
    fn the_copy_s_output_reaches_the_log_whole_and_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, path) = log_file(dir.path());
        let (r, mut w) = pipe();
        let writer = std::thread::spawn(move || {
            for i in 0..1000 {
                writeln!(w, "line {i}").unwrap();
            }
        });
        pump(r, &mut log, 1 << 30, 64);
        writer.join().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let want: String = (0..1000).map(|i| format!("line {i}\n")).collect();
        assert_eq!(text, want);
    }

    #[test]
    fn a_line_longer_than_the_most_is_ended_there_across_reads() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, path) = log_file(dir.path());
        let mut bounds = Bounds { max: 1 << 30, line_max: 10, line: 0, dropped: 0 };
        // 25 bytes in three reads, then a short line: a most of 10.
        for part in ["aaaaaaaa", "aaaaaaaaaaaa", "aaaaa\nbb\n"] {
            bounds.take(part.as_bytes(), &mut log);
        }
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "aaaaaaaaaa\naaaaaaaaaa\naaaaa\nbb\n");
    }

    #[test]
    fn past_the_most_the_output_is_dropped_and_counted_once_the_log_is_rotated() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, path) = log_file(dir.path());
        let mut bounds = Bounds { max: 100, line_max: 1000, line: 0, dropped: 0 };
        bounds.take(&[b'x'; 150], &mut log);
        bounds.take(&[b'y'; 40], &mut log); // the log is past 100: dropped
        bounds.take(&[b'z'; 2], &mut log);
        // The daemon rotates (copy and truncate in place).
        let rotated = dir.path().join("copy.log.1");
        std::fs::copy(&path, &rotated).unwrap();
        File::options().write(true).open(&path).unwrap().set_len(0).unwrap();
        bounds.take(b"after\n", &mut log);
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "\n--- shinyctl: 42 bytes of the copy's output dropped: its log passed 100 bytes before it was rotated ---\nafter\n"
        );
        assert_eq!(std::fs::read(rotated).unwrap(), vec![b'x'; 150]);
    }

    #[test]
    fn a_pump_never_started_takes_what_waits_in_the_pipe_without_waiting_for_more() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, path) = log_file(dir.path());
        let (r, mut w) = pipe();
        w.write_all(b"failed before the pump started\n").unwrap();
        nix::fcntl::fcntl(r.as_raw_fd(), nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK)).unwrap();
        // The write end stays open: a blocking read would never return.
        pump(r, &mut log, 1 << 30, 1000);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "failed before the pump started\n");
        drop(w);
    }
}
