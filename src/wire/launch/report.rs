//! What isolation a copy got, as the launcher reports it to the daemon: a
//! small JSON file beside the copy's scratch disk, keyed by the copy's PID
//! (the launcher's, which R keeps), so a report of an earlier process of
//! the same copy is never taken for this one's.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::wire::Isolation;

/// The report file as written: the isolation, the PID it is about (the
/// launcher's, which the daemon records) and R's PID as the host sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// The copy's PID as the daemon records it: the launcher's.
    pub pid: u32,
    /// R's PID on the host: the launcher's own when it exec'd R (no PID
    /// namespace), the init's child otherwise.
    #[serde(default)]
    pub r_pid: Option<u32>,
    /// Why the launcher refused to start R (`mode: strict` and a fence
    /// missing); the launcher then ends with [`super::EXIT_REFUSED`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    /// When (Unix ms) the launcher was told R starts: a cold copy's R is
    /// exec'd (the init's word comes as its pipe closes at the exec), a
    /// claimed fork has taken the copy on. A wake's steps start R's own
    /// time here (README, "Sleep").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub r_started_ms: Option<u64>,
    /// A claimed copy's fork of the pool's zygote (`claim`): the root of
    /// the copy's processes, which are not below the launcher.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fork: Option<u32>,
    /// What it got.
    #[serde(flatten)]
    pub isolation: Isolation,
}

/// Where the launcher reports copy N's isolation: `<N>.launch.json` beside
/// its scratch disk `…/scratch/<group>-<name>/<N>`, outside what the copy
/// may write to.
pub fn report_path(scratch: &Path) -> PathBuf {
    let name = scratch.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    scratch.with_file_name(format!("{name}.launch.json"))
}

/// The report of the copy whose recorded process is `pid`, if its launcher
/// reported one (copies started before the launcher existed have none).
pub fn read_report(scratch: &Path, pid: u32) -> Option<Report> {
    let bytes = std::fs::read(report_path(scratch)).ok()?;
    let report: Report = serde_json::from_slice(&bytes).ok()?;
    if report.pid != pid {
        return None;
    }
    // A claimed copy's processes count as its launcher's (`procfs`).
    if let Some(fork) = report.fork {
        crate::sys::procfs::adopt(fork, pid);
    }
    Some(report)
}

impl Writer {
    /// Says how the copy's R started (claimed from the pool, or cold and
    /// why): written with the isolation.
    pub fn started(&mut self, how: String) {
        self.start = Some(how);
    }

    /// Says the copy was claimed from the pool, by the zygote's `fork`.
    pub fn claimed(&mut self, fork: u32) {
        self.start = Some(format!("claimed from the pool (the zygote's fork {fork})"));
        self.fork = Some(fork);
    }
}

/// The report file, opened (and emptied) before the launcher leaves the
/// host's view of the filesystem, written once the isolation is known.
pub struct Writer {
    /// The open file.
    file: File,
    /// How R started (claimed from the pool, or cold and why), once known.
    start: Option<String>,
    /// A claimed copy's fork of the zygote.
    fork: Option<u32>,
    /// Room for the report was taken on the disk when it was opened, so
    /// writing it cannot fail for want of space (see [`Writer::open`]).
    reserved: bool,
}

/// The room a report takes at most.
const RESERVED: i64 = 16 << 10;

impl Writer {
    /// Opens and empties the report file, and takes its room on the disk
    /// at once: a claimed copy's R is found through its report (its fork is
    /// not below the launcher), so a copy started on a full disk, whose
    /// report could not be written, starts cold instead ([`Writer::reserved`]).
    pub fn open(path: &Path) -> std::io::Result<Writer> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
        let reserved = nix::fcntl::fallocate(file.as_raw_fd(), nix::fcntl::FallocateFlags::empty(), 0, RESERVED).is_ok();
        Ok(Writer { file, start: None, fork: None, reserved })
    }

    /// True when the report's room on the disk was taken.
    pub fn reserved(&self) -> bool {
        self.reserved
    }

    /// Writes the report for this process, whose R is `r_pid` and starts
    /// now, or which `refused` to start R. A failure only costs the daemon
    /// the field in status (and a refusal is then taken for a crash), so it
    /// is not an error.
    pub fn write(mut self, isolation: &Isolation, r_pid: Option<u32>, refused: Option<&str>) {
        let mut isolation = isolation.clone();
        isolation.start = self.start.take();
        let r_started_ms = r_pid.map(|_| crate::sys::clock::now_ms());
        let report =
            Report { pid: std::process::id(), r_pid, r_started_ms, refused: refused.map(str::to_string), fork: self.fork, isolation };
        if let Ok(bytes) = serde_json::to_vec(&report) {
            // Into the room taken, then cut to the report's length.
            if self.file.write_all(&bytes).is_ok() {
                let _ = self.file.set_len(bytes.len() as u64);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::IsolationKind;

    #[test]
    fn the_report_sits_beside_the_scratch_disk() {
        assert_eq!(report_path(Path::new("/h/scratch/default-hello/2")), Path::new("/h/scratch/default-hello/2.launch.json"));
    }

    #[test]
    fn a_report_is_read_only_for_its_own_pid() {
        let tmp_dir = tempfile::tempdir().unwrap();
        let dir = tmp_dir.path().to_path_buf();
        let scratch = dir.join("1");
        std::fs::create_dir_all(&scratch).unwrap();
        let iso =
            Isolation { kind: IsolationKind::Landlock, reason: Some("no user namespaces".into()), fences: vec![], user: None, start: None };
        Writer::open(&report_path(&scratch)).unwrap().write(&iso, Some(7), None);
        let got = read_report(&scratch, std::process::id()).expect("its own report");
        assert_eq!((got.isolation, got.r_pid, got.refused), (iso.clone(), Some(7), None));
        let now = crate::sys::clock::now_ms();
        assert!(got.r_started_ms.is_some_and(|at| at <= now && at + 60_000 > now), "when R started: {:?}", got.r_started_ms);
        assert_eq!(read_report(&scratch, std::process::id() + 1), None, "another process of the same copy");
        let text = std::fs::read_to_string(report_path(&scratch)).unwrap();
        assert!(text.contains("\"kind\":\"landlock\""), "{text}");
        Writer::open(&report_path(&scratch)).unwrap().write(&iso, None, Some("sandbox mode strict and fences are missing: user-ns"));
        let got = read_report(&scratch, std::process::id()).expect("its own report");
        assert_eq!(got.refused.as_deref(), Some("sandbox mode strict and fences are missing: user-ns"), "a refusal is reported");
    }
}
