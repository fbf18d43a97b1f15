//! How the daemon runs `shinyctl reclaim` (hidden; the process is
//! `reclaim.rs`) and reads its answer: its arguments (`FIRST COUNT [--du
//! MS] PATH…`) and, for `--du`, the two numbers it prints.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::sys::disk::Usage;

/// Removes `path` (a folder with what it holds) through `shinyctl reclaim`
/// with the subordinate ids `first..=last` mapped. Blocking: call it from a
/// thread of its own.
pub fn remove(path: &Path, (first, last): (u32, u32)) -> std::io::Result<()> {
    let exe = std::env::current_exe()?;
    let out = Command::new(exe)
        .arg("reclaim")
        .arg(first.to_string())
        .arg((last - first + 1).to_string())
        .arg(path)
        .stdin(std::process::Stdio::null())
        .output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!("shinyctl reclaim: {}", String::from_utf8_lossy(&out.stderr).trim())))
    }
}

/// What the disk watch needs of folders a copy wrote as a subordinate id
/// (README, "Limits"): the bytes below them, and of those the bytes of files
/// last written before `started_ms`, counted where the range is mapped.
/// Blocking: call it from a thread of its own.
pub fn measure(paths: &[PathBuf], started_ms: u64, (first, last): (u32, u32)) -> std::io::Result<Usage> {
    let out = Command::new(std::env::current_exe()?)
        .arg("reclaim")
        .args([first.to_string(), (last - first + 1).to_string(), "--du".to_string(), started_ms.to_string()])
        .args(paths)
        .stdin(std::process::Stdio::null())
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut n = text.split_whitespace().filter_map(|w| w.parse::<u64>().ok());
    match (out.status.success(), n.next(), n.next()) {
        (true, Some(used), Some(before)) => Ok(Usage { used, before }),
        _ => Err(std::io::Error::other(format!("shinyctl reclaim --du: {}", String::from_utf8_lossy(&out.stderr).trim()))),
    }
}
