//! The fallback where no mount namespace can be made: Landlock rules that
//! let the copy write only to its scratch disk, /tmp and /dev/shm, and the
//! character devices R writes to. Everything else (the app folder first of
//! all) stays readable and is not writable. Reads and execution are not
//! limited.

use std::path::{Path, PathBuf};

use landlock::{
    path_beneath_rules, AccessFs, CompatLevel, Compatible, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus,
    ABI,
};

/// The newest Landlock ABI whose write rights are asked for; an older
/// kernel enforces what it knows (best effort).
const ABI_WANTED: ABI = ABI::V5;

/// Folders the copy may write below, besides its scratch disk.
const WRITABLE: [&str; 3] = ["/tmp", "/dev/shm", "/var/tmp"];

/// Devices the copy may open for writing.
const DEVICES: [&str; 6] = ["/dev/null", "/dev/zero", "/dev/full", "/dev/tty", "/dev/random", "/dev/urandom"];

/// Restricts this process (and what it execs) to writing below `scratch`,
/// [`WRITABLE`] and [`DEVICES`], but never below `app_dir`: Landlock only
/// adds rights, so a writable folder that holds the app folder (a test's
/// /tmp) is left out, and R gets `tmp` (a folder beside the scratch disk,
/// returned) as its TMPDIR instead. `Err(reason)` when Landlock is not there.
pub fn restrict(scratch: &Path, app_dir: &Path) -> Result<Option<PathBuf>, String> {
    let write = AccessFs::from_write(ABI_WANTED);
    let created = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(write)
        .and_then(|r| r.create())
        .map_err(|e| format!("Landlock cannot be set up ({e})"))?;
    let (mut folders, holding): (Vec<PathBuf>, Vec<PathBuf>) =
        WRITABLE.iter().map(PathBuf::from).filter(|p| p.exists()).partition(|p| !app_dir.starts_with(p));
    let tmpdir = match holding.is_empty() {
        true => None,
        false => Some(own_tmp(scratch).map_err(|e| format!("no TMPDIR for the copy ({e})"))?),
    };
    folders.push(scratch.to_path_buf());
    folders.extend(tmpdir.clone());
    let status = created
        .add_rules(path_beneath_rules(folders, write))
        .and_then(|r| r.add_rules(path_beneath_rules(DEVICES.iter().filter(|d| Path::new(d).exists()), write)))
        .and_then(|r| r.restrict_self())
        .map_err(|e| format!("Landlock cannot be set up ({e})"))?;
    match status.ruleset {
        RulesetStatus::FullyEnforced | RulesetStatus::PartiallyEnforced => Ok(tmpdir),
        RulesetStatus::NotEnforced => Err("Landlock is not available in this kernel".to_string()),
    }
}

/// `<scratch>.tmp`, beside the scratch disk: the copy's TMPDIR when /tmp
/// cannot be writable.
fn own_tmp(scratch: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = tmp_path(scratch);
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir)?;
    Ok(dir)
}

/// `<scratch>.tmp`: where [`own_tmp`] is.
pub fn tmp_path(scratch: &Path) -> PathBuf {
    let name = scratch.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    scratch.with_file_name(format!("{name}.tmp"))
}
