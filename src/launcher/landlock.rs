//! Landlock, twice.
//!
//! [`fence`]: the fence's ruleset for every fenced copy: writes only to the
//! copy's places and the devices R needs, binding only its own port, and
//! signals and abstract Unix sockets scoped to the copy.
//!
//! [`restrict`]: the fallback where no mount namespace can be made: rules that
//! let the copy write only to its scratch disk, its TMPDIR, /tmp and /dev/shm, and the
//! character devices R writes to. Everything else (the app folder first of
//! all) stays readable and is not writable. Reads and execution are not
//! limited.

use std::path::{Path, PathBuf};

use landlock::{
    path_beneath_rules, AccessFs, AccessNet, CompatLevel, Compatible, NetPort, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus,
    Scope, ABI,
};
use serde::{Deserialize, Serialize};

/// The newest Landlock ABI whose write rights are asked for; an older
/// kernel enforces what it knows (best effort).
const ABI_WANTED: ABI = ABI::V5;

/// Folders the copy may write below, besides its scratch disk.
const WRITABLE: [&str; 3] = ["/tmp", "/dev/shm", "/var/tmp"];

/// Devices the copy may open for writing.
const DEVICES: [&str; 6] = ["/dev/null", "/dev/zero", "/dev/full", "/dev/tty", "/dev/random", "/dev/urandom"];

/// Restricts this process (and what it execs) to writing below `scratch`,
/// `tmp` (the copy's TMPDIR, a folder beside the scratch disk, when it has
/// one), [`WRITABLE`] and [`DEVICES`], but never below `app_dir`: Landlock
/// only adds rights, so a writable folder that holds the app folder (a
/// test's /tmp) is left out. `Err(reason)` when Landlock is not there.
pub fn restrict(scratch: &Path, tmp: Option<&Path>, app_dir: &Path) -> Result<(), String> {
    let write = AccessFs::from_write(ABI_WANTED);
    let created = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(write)
        .and_then(|r| r.create())
        .map_err(|e| format!("Landlock cannot be set up ({e})"))?;
    let mut folders: Vec<PathBuf> = WRITABLE.iter().map(PathBuf::from).filter(|p| p.exists() && !app_dir.starts_with(p)).collect();
    folders.push(scratch.to_path_buf());
    folders.extend(tmp.map(Path::to_path_buf));
    let status = created
        .add_rules(path_beneath_rules(folders, write))
        .and_then(|r| r.add_rules(path_beneath_rules(DEVICES.iter().filter(|d| Path::new(d).exists()), write)))
        .and_then(|r| r.restrict_self())
        .map_err(|e| format!("Landlock cannot be set up ({e})"))?;
    match status.ruleset {
        RulesetStatus::FullyEnforced | RulesetStatus::PartiallyEnforced => Ok(()),
        RulesetStatus::NotEnforced => Err("Landlock is not available in this kernel".to_string()),
    }
}

/// What the fence's Landlock ruleset gave the copy.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct LandlockApplied {
    /// The kernel's Landlock ABI (0: no Landlock).
    pub abi: u32,
    /// Writes are limited to the copy's places (ABI 1).
    pub writes: bool,
    /// Binding is limited to the copy's own port (ABI 4).
    pub bind: bool,
    /// Signals and abstract Unix sockets reach only the copy's own
    /// processes (ABI 6).
    pub scopes: bool,
    /// What is missing, and why.
    pub missing: Option<String>,
}

impl LandlockApplied {
    /// Everything the fence asks of Landlock is in force.
    pub fn whole(&self) -> bool {
        self.writes && self.bind && self.scopes
    }
}

/// Devices and device folders the fence lets a copy write to.
const FENCE_DEVICES: [&str; 8] = ["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty", "/dev/pts", "/dev/shm"];

/// The Landlock ABI of the running kernel (0 when there is none), asked of
/// the kernel itself.
pub fn kernel_abi() -> u32 {
    // SAFETY: LANDLOCK_CREATE_RULESET_VERSION takes no attributes and
    // returns the ABI version or -1; no memory is passed.
    let v = unsafe { libc::syscall(libc::SYS_landlock_create_ruleset, std::ptr::null::<u8>(), 0usize, 1u32) };
    u32::try_from(v).unwrap_or(0)
}

/// The fence's ruleset on this process (and what it execs): writes only
/// below `writable` (the places that exist) and to [`FENCE_DEVICES`]; bind
/// only `port`; signals and abstract Unix sockets scoped to this domain.
/// Reads, execution and connecting stay open. Best effort: what the kernel
/// lacks is named in `missing`.
pub fn fence(writable: &[PathBuf], port: u16) -> LandlockApplied {
    let abi = kernel_abi();
    if abi == 0 {
        return LandlockApplied { missing: Some(no_landlock_reason()), ..LandlockApplied::default() };
    }
    let mut applied = LandlockApplied { abi, writes: true, bind: abi >= 4, scopes: abi >= 6, missing: None };
    if let Err(e) = fence_ruleset(ABI::from(abi as i32), writable, port, &applied) {
        return LandlockApplied { abi, missing: Some(format!("Landlock cannot be set up ({e})")), ..LandlockApplied::default() };
    }
    let mut lacking = Vec::new();
    if !applied.bind {
        lacking.push("binding ports (needs ABI 4, Linux 6.7)");
    }
    if !applied.scopes {
        lacking.push("scoping signals and abstract sockets (needs ABI 6, Linux 6.12)");
    }
    if !lacking.is_empty() {
        applied.missing = Some(format!("this kernel's Landlock (ABI {abi}) has no {}", lacking.join(" and no ")));
    }
    applied
}

/// Builds and enforces the ruleset for `abi`, asking only for what
/// `applied` says the kernel has.
fn fence_ruleset(abi: ABI, writable: &[PathBuf], port: u16, applied: &LandlockApplied) -> Result<(), landlock::RulesetError> {
    let write = AccessFs::from_write(abi);
    let mut ruleset = Ruleset::default().set_compatibility(CompatLevel::BestEffort).handle_access(write)?;
    if applied.bind {
        ruleset = ruleset.handle_access(AccessNet::BindTcp)?;
    }
    if applied.scopes {
        ruleset = ruleset.scope(Scope::AbstractUnixSocket | Scope::Signal)?;
    }
    let mut created = ruleset
        .create()?
        .add_rules(path_beneath_rules(writable.iter().filter(|p| p.exists()), write))?
        .add_rules(path_beneath_rules(FENCE_DEVICES.iter().filter(|d| Path::new(d).exists()), write))?;
    if applied.bind {
        created = created.add_rule(NetPort::new(port, AccessNet::BindTcp))?;
    }
    created.restrict_self()?;
    Ok(())
}

/// Why the kernel has no Landlock: not built in, or not in the LSM list.
fn no_landlock_reason() -> String {
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::EOPNOTSUPP) => "Landlock is built into this kernel but not enabled (add landlock to the lsm= boot parameter)".into(),
        _ => "this kernel has no Landlock (Linux 5.13 or later with CONFIG_SECURITY_LANDLOCK)".into(),
    }
}
