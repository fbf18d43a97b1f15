//! `proxy/lock`: held (flock, exclusive) by the running load balancer, with
//! its PID written in it, so a second one started on the same home exits
//! with a clear message instead of fighting over the ports. One started to
//! take over (see `handover.rs`) waits for the lock on a thread of its own.

use std::fs;
use std::io::{self, Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

/// What trying `proxy/lock` found.
pub enum Lock {
    /// Ours now, with our PID written in it; let go when dropped.
    Taken(Flock<fs::File>),
    /// Another load balancer holds it; its PID as written there.
    Held(String),
}

/// Tries `proxy/lock` (exclusive, non-blocking).
pub fn take(path: &Path) -> anyhow::Result<Lock> {
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
        .map_err(|e| anyhow::anyhow!("cannot open {}: {e}", path.display()))?;
    match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
        Ok(mut locked) => {
            write_pid(&mut locked)?;
            Ok(Lock::Taken(locked))
        }
        Err((mut f, e)) if e == Errno::EWOULDBLOCK => {
            let mut pid = String::new();
            let _ = f.read_to_string(&mut pid);
            let pid = pid.trim();
            Ok(Lock::Held(if pid.is_empty() { "unknown".into() } else { pid.into() }))
        }
        Err((_, e)) => anyhow::bail!("cannot lock {}: {}", path.display(), io::Error::from(e)),
    }
}

fn write_pid(f: &mut fs::File) -> io::Result<()> {
    f.set_len(0)?;
    f.rewind()?;
    writeln!(f, "{}", std::process::id())
}

/// Takes `proxy/lock` once the load balancer we replace lets it go, on a
/// thread of its own, and holds it until we exit.
pub fn wait_for(path: PathBuf) {
    std::thread::spawn(move || {
        let Ok(f) = fs::OpenOptions::new().read(true).write(true).open(&path) else {
            tracing::error!("cannot open {} to take it over", path.display());
            return;
        };
        let mut locked = match Flock::lock(f, FlockArg::LockExclusive) {
            Ok(l) => l,
            Err((_, e)) => {
                tracing::error!("cannot lock {}: {}", path.display(), io::Error::from(e));
                return;
            }
        };
        let _ = write_pid(&mut locked);
        tracing::info!("the replaced load balancer is gone; {} is ours", path.display());
        // Held, like the lock of a load balancer that started alone, until exit.
        std::mem::forget(locked);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_taker_finds_the_lock_held_with_the_pid() {
        let tmp_dir = tempfile::tempdir().unwrap();
        let dir = tmp_dir.path().to_path_buf();
        let path = dir.join("lock");
        let first = take(&path).unwrap();
        assert!(matches!(first, Lock::Taken(_)));
        // flock locks belong to the open file description, so a second
        // open in the same process is refused like another process would be.
        match take(&path).unwrap() {
            Lock::Held(pid) => assert_eq!(pid, std::process::id().to_string()),
            Lock::Taken(_) => panic!("the lock was taken twice"),
        }
        drop(first);
        assert!(matches!(take(&path).unwrap(), Lock::Taken(_)));
    }
}
