//! Removing what a copy wrote under a daemon that is not root (README,
//! "Identities"): the copy ran as one of its user's subordinate ids, so its
//! files and folders (mode 0700, say) are not the daemon's to delete. As
//! `podman unshare` does, `shinyctl reclaim` (hidden; run by the daemon)
//! forks a child into a user namespace where the daemon's user is root and
//! the subordinate range is mapped, has `newuidmap`/`newgidmap` map it from
//! outside, and removes the paths there, with the capabilities that
//! namespace gives over every file of those ids.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::Command;

use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{fork, ForkResult, Pid};

use crate::sys::disk::{usage, Usage};
use crate::sys::users::{NEWGIDMAP, NEWUIDMAP};

/// What the child does where the range is mapped.
enum Work {
    /// Remove the paths.
    Remove,
    /// Print the bytes below the paths, then those of files written before
    /// this time (Unix ms).
    Measure(u64),
}

/// `shinyctl reclaim FIRST COUNT [--du MS] PATH…`: returns the exit status.
pub fn main(args: &[OsString]) -> i32 {
    let parsed = (|| -> Option<(u32, u32, Work, Vec<PathBuf>)> {
        let first = args.first()?.to_str()?.parse().ok()?;
        let count = args.get(1)?.to_str()?.parse().ok()?;
        let (work, rest) = match args.get(2).and_then(|a| a.to_str()) {
            Some("--du") => (Work::Measure(args.get(3)?.to_str()?.parse().ok()?), &args[4..]),
            _ => (Work::Remove, &args[2..]),
        };
        Some((first, count, work, rest.iter().map(PathBuf::from).collect()))
    })();
    let Some((first, count, work, paths)) = parsed else {
        eprintln!("usage: shinyctl reclaim FIRST COUNT [--du MS] PATH...");
        return 2;
    };
    match run(first, count, &work, &paths) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{e}");
            1
        }
    }
}

/// Forks the child that unshares, maps it, lets it remove `paths`.
fn run(first: u32, count: u32, work: &Work, paths: &[PathBuf]) -> Result<(), String> {
    let pipe = || nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| format!("no pipe: {e}"));
    let ((ready_r, ready_w), (go_r, go_w)) = (pipe()?, pipe()?);
    // SAFETY: `shinyctl reclaim` is a fresh single-threaded process.
    match unsafe { fork() }.map_err(|e| format!("cannot fork: {e}"))? {
        ForkResult::Child => {
            drop((ready_r, go_w));
            let code = match in_namespace(ready_w, go_r, work, paths) {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("{e}");
                    1
                }
            };
            std::process::exit(code)
        }
        ForkResult::Parent { child } => {
            drop((ready_w, go_r));
            let mapped = std::fs::File::from(ready_r)
                .read(&mut [0u8; 1])
                .ok()
                .filter(|&n| n == 1)
                .ok_or("the child made no namespace".to_string())
                .and_then(|_| map(child, first, count));
            if mapped.is_ok() {
                let _ = std::fs::File::from(go_w).write_all(b"g");
            } else {
                drop(go_w);
            }
            let status = waitpid(child, None).map_err(|e| format!("cannot wait for the child: {e}"))?;
            mapped?;
            match status {
                WaitStatus::Exited(_, 0) => Ok(()),
                s => Err(format!("the removal ended with {s:?}")),
            }
        }
    }
}

/// Maps, in `child`'s user namespace, root to the daemon's user and 1.. to
/// the subordinate range.
fn map(child: Pid, first: u32, count: u32) -> Result<(), String> {
    let ids = [(NEWUIDMAP, nix::unistd::getuid().as_raw()), (NEWGIDMAP, nix::unistd::getgid().as_raw())];
    for (tool, own) in ids {
        let out = Command::new(tool)
            .arg(child.to_string())
            .args([0, own, 1, 1, first, count].map(|n| n.to_string()))
            .output()
            .map_err(|e| format!("cannot run {tool}: {e}"))?;
        if !out.status.success() {
            return Err(format!("{tool}: {}", String::from_utf8_lossy(&out.stderr).trim()));
        }
    }
    Ok(())
}

/// In the child: a user namespace of its own, mapped from outside, then
/// the removal.
fn in_namespace(ready: std::os::fd::OwnedFd, go: std::os::fd::OwnedFd, work: &Work, paths: &[PathBuf]) -> Result<(), String> {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER).map_err(|e| format!("cannot make a user namespace: {e}"))?;
    std::fs::File::from(ready).write_all(b"r").map_err(|e| e.to_string())?;
    let mut byte = [0u8; 1];
    if std::fs::File::from(go).read(&mut byte).ok() != Some(1) {
        return Err("the ids were not mapped".into());
    }
    if let Work::Measure(ms) = work {
        let Usage { used, before } = usage(paths, *ms);
        println!("{used} {before}");
        return Ok(());
    }
    for p in paths {
        let gone = if p.is_dir() { std::fs::remove_dir_all(p) } else { std::fs::remove_file(p) };
        match gone {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("cannot delete {}: {e}", p.display())),
        }
    }
    Ok(())
}
