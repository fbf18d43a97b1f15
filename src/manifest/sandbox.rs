//! The `sandbox:` section of a manifest, as the rest of shinyctl sees it:
//! how each copy of the app is fenced (README, "The fence").
//! The launcher (`src/launcher/`) builds the fence from it; the daemon
//! watches the limits it cannot leave to the kernel.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// `sandbox.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SandboxMode {
    /// Every fence this machine allows; the missing ones are reported.
    #[default]
    On,
    /// No fence for this app: a plain process (the release is read-only by
    /// its mode bits only).
    Off,
    /// The whole fence or no start: a copy that cannot have every fence is
    /// refused.
    Strict,
}

/// `sandbox.syscalls`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Syscalls {
    /// The filter: what an R app never needs is refused with EPERM.
    #[default]
    Default,
    /// No system-call filter.
    Unconfined,
}

/// The default `sandbox.tasks`: processes and threads of one copy. R with
/// its BLAS threads and a few `system()` children stays far below it.
pub const DEFAULT_TASKS: u32 = 512;
/// The default `sandbox.open-files` (RLIMIT_NOFILE of a copy).
pub const DEFAULT_OPEN_FILES: u64 = 4096;
/// The default `sandbox.disk`: scratch, /tmp and /dev/shm of one copy
/// together. Room for uploads, caches and a report render; an empty disk
/// costs next to nothing (a sparse image), so the default can be generous
/// without reserving anything.
pub const DEFAULT_DISK: u64 = 1 << 30;
/// The least `sandbox.disk`: the filesystem's own bookkeeping takes a few
/// megabytes, and R writes to its tempdir at start.
pub const MIN_DISK: u64 = 16 << 20;

/// `sandbox.disk`: how much scratch, /tmp and /dev/shm of one copy may hold
/// together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Disk {
    /// At most this many bytes.
    Size(u64),
    /// No size: the copy writes to the host's disk.
    Unlimited,
}

impl Default for Disk {
    fn default() -> Self {
        Disk::Size(DEFAULT_DISK)
    }
}

impl Disk {
    /// The size in bytes; none for `unlimited`.
    pub fn bytes(self) -> Option<u64> {
        match self {
            Disk::Size(b) => Some(b),
            Disk::Unlimited => None,
        }
    }

    /// True at the default (left out of the settings' JSON, so the hash of
    /// an app from before the key stays what it was).
    pub fn is_default(&self) -> bool {
        *self == Disk::default()
    }
}

/// How each copy of an app is fenced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case")]
pub struct Sandbox {
    /// `mode`: on (default), off or strict.
    pub mode: SandboxMode,
    /// `memory` in bytes (`512M`, `2G`); none: no limit.
    pub memory: Option<u64>,
    /// `tasks`: the most processes and threads of one copy.
    pub tasks: u32,
    /// `open-files`: RLIMIT_NOFILE of a copy.
    pub open_files: u64,
    /// `writable-paths`: absolute host paths the copy may write besides its
    /// scratch disk and /tmp.
    pub writable_paths: Vec<PathBuf>,
    /// `hidden-paths`: absolute host paths the copy must not see (besides
    /// ~/.ssh, ~/.gnupg, ~/.aws and SHINYCTL_HOME, always hidden).
    pub hidden_paths: Vec<PathBuf>,
    /// `syscalls`: default or unconfined.
    pub syscalls: Syscalls,
    /// `disk`: the size of scratch, /tmp and /dev/shm together. Left out of
    /// the JSON at its default (the settings' hash of apps from before it).
    #[serde(skip_serializing_if = "Disk::is_default")]
    pub disk: Disk,
}

impl Default for Sandbox {
    fn default() -> Self {
        Sandbox {
            mode: SandboxMode::On,
            memory: None,
            tasks: DEFAULT_TASKS,
            open_files: DEFAULT_OPEN_FILES,
            writable_paths: Vec::new(),
            hidden_paths: Vec::new(),
            syscalls: Syscalls::Default,
            disk: Disk::default(),
        }
    }
}

/// The least `sandbox.memory`: R with shiny loaded needs about this to start.
pub const MIN_MEMORY: u64 = 64 << 20;
/// The fewest `sandbox.tasks`: R, its BLAS threads and a child or two.
pub const MIN_TASKS: u32 = 32;
/// The most `sandbox.tasks` (the kernel's own most, `pid_max`).
pub const MAX_TASKS: u32 = 4_194_304;
/// The fewest `sandbox.open-files`: R opens its libraries and packages.
pub const MIN_OPEN_FILES: u64 = 64;
/// The most `sandbox.open-files`: the usual hard limit (`fs.nr_open`).
pub const MAX_OPEN_FILES: u64 = 1_048_576;

/// Parses a size: a whole number of bytes, or a number (a fraction allowed)
/// with a unit K, M, G or T (powers of 1024; `Ki`, `KB`, `KiB` and lower
/// case too): `512M`, `2G`, `1.5G`. None for anything else or an overflow.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let unit = unit.trim_start().to_ascii_uppercase();
    let unit = unit.strip_suffix('B').unwrap_or(&unit);
    let unit = unit.strip_suffix('I').unwrap_or(unit);
    let shift = match unit {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return None,
    };
    if num.is_empty() || num.starts_with('.') || num.ends_with('.') || num.matches('.').count() > 1 {
        return None;
    }
    if !num.contains('.') {
        return num.parse::<u64>().ok()?.checked_mul(1u64 << shift);
    }
    if shift == 0 {
        return None;
    }
    let v = num.parse::<f64>().ok()? * (1u64 << shift) as f64;
    (v < u64::MAX as f64).then_some(v as u64)
}
