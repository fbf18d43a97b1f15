//! Other builds of shinyctl for the upgrade tests, and running a binary
//! the test just wrote.

use super::*;

/// The build of the release before this one (`SHINYCTL_PREVIOUS_BUILD`,
/// which `./test.sh` builds from git into `target/previous`): a build whose
/// code really differs, for an upgrade.
pub fn previous_build() -> PathBuf {
    let path = std::env::var_os("SHINYCTL_PREVIOUS_BUILD").map(PathBuf::from).unwrap_or_else(|| {
        panic!(
            "SHINYCTL_PREVIOUS_BUILD is not set: run the tests through ./test.sh, which builds the previous release into target/previous"
        )
    });
    assert!(path.is_file(), "the previous build {} is missing: ./test.sh builds it", path.display());
    path
}

/// Runs `cmd` to its end. A binary this process has just written (another
/// build, a copy) can be busy for a moment (ETXTBSY): a child that another
/// test forked while the file was open for writing holds the descriptor
/// until it execs. Tried again for up to a second.
pub(super) fn output_when_not_busy(cmd: &mut Command) -> Output {
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        match cmd.output() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            result => return result.expect("run shinyctl"),
        }
    }
}

/// A copy of the binary under test that says it is another build: the
/// build identity (`0.1.0+<16 hex digits>`) is rewritten in its bytes.
pub fn another_build(dir: &Path) -> PathBuf {
    let version = String::from_utf8(std::process::Command::new(bin()).arg("version").output().unwrap().stdout).unwrap();
    let build = version.trim().strip_prefix("shinyctl ").unwrap().to_string();
    let (_, id) = build.split_once('+').unwrap();
    assert_eq!(id.len(), 16);
    let other: String = id.chars().map(|c| if c == '0' { '1' } else { '0' }).collect();
    let bytes = std::fs::read(bin()).unwrap();
    let (from, to) = (build.as_bytes(), format!("{}+{other}", build.split_once('+').unwrap().0).into_bytes());
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    let mut replaced = 0;
    while i < bytes.len() {
        if bytes[i..].starts_with(from) {
            out.extend_from_slice(&to);
            i += from.len();
            replaced += 1;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    assert!(replaced > 0, "the build identity is in the binary");
    let path = dir.join("old-build").join("shinyctl");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, out).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}
