//! How the daemon starts a copy's launcher (`shinyctl launch`, hidden),
//! and what the two tell each other: the launcher's arguments ([`Launch`],
//! one JSON value after `--home`, or the per-setting arguments of the build
//! before it, `legacy.rs`), its exit statuses, the line it leaves in the
//! copy's log when it could not launch, the report it writes beside the
//! copy's scratch disk ([`report`], with the [`fences`] it names), the
//! pool's zygote's start ([`zygote`]), and the files a forgotten copy's
//! launcher left ([`remove_scratch`]). The daemon never runs the
//! launcher's code in its own process: it builds a [`Launch`] and executes
//! this binary with it (`Launch::command`), and reads back what the
//! launcher wrote.

/// Copy logs rotate past this size (the daemon); the launcher's pump drops
/// a copy's output past twice it (README, "Logs").
pub const LOG_ROTATE_BYTES: u64 = 1 << 30;

pub mod fences;
mod legacy;
pub mod report;
pub mod zygote;

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};

use crate::manifest::StartSpec;
use crate::sys::disk;
use report::report_path;

/// The launcher's exit status when it could not start the copy (bad
/// arguments, a mount that failed half-way): the copy's log says why.
pub const EXIT_LAUNCH_FAILED: i32 = 121;
/// The launcher's exit status when it refused to start R (`mode: strict`
/// and a fence missing): its report says why ([`Report::refused`]), so the
/// daemon leaves the copy down instead of retrying it as a crash (R ending
/// with the same status has no such report).
pub const EXIT_REFUSED: i32 = 122;
/// The launcher's exit status when R itself could not be run.
pub const EXIT_NO_R: i32 = 127;

/// Everything the launcher needs to start one copy: the app's start spec
/// whole, and beside it what is this copy's own. The daemon builds it and
/// turns it into a command line ([`Launch::command`]): `--home HOME` and
/// `--spec JSON` (this value); the launcher reads it back ([`Launch::parse`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Launch {
    /// SHINYCTL_HOME: hidden from the copy, and the mark by which a test
    /// (or a person) finds the processes of one home, since a copy's
    /// environment no longer names it. In the argv of its own (`--home`),
    /// not in the JSON.
    #[serde(skip)]
    pub home: PathBuf,
    /// The app's name: the copy's hostname.
    pub app: String,
    /// The copy number (for the log line).
    pub copy: u32,
    /// The copy's port on 127.0.0.1.
    pub port: u16,
    /// The folder to run, as the host sees it (a release, or working-dir).
    pub app_dir: PathBuf,
    /// The copy's own disk, as the host sees it.
    pub scratch: PathBuf,
    /// The app's own uid (and gid), which a root daemon runs the copy as
    /// without `run-as` (README, "Identities").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// The copy's cgroups (its memory and tasks limits), joined first
    /// thing, before any namespace: one per hierarchy (cgroup v1 has one
    /// for memory and one for pids), none where there is no cgroup.
    #[serde(default)]
    pub cgroups: Vec<PathBuf>,
    /// How the copy starts: the release's start spec. Its `env` travels as
    /// the launcher's environment, not on its command line (which every
    /// user of the machine may read): it is empty here.
    pub start: StartSpec,
    /// The pool's zygote socket: the copy is claimed from it (`claim`),
    /// and started cold only if the claim is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<PathBuf>,
    /// Why the daemon starts this copy cold (no `pool`), for its status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cold: Option<String>,
}

impl Launch {
    /// The launcher's arguments after `launch`.
    pub fn args(&self) -> Vec<OsString> {
        let mut told = self.clone();
        told.start.env.clear();
        // A struct of text, numbers and paths from a manifest (UTF-8):
        // serializing it cannot fail.
        let spec = serde_json::to_string(&told).unwrap_or_default();
        vec!["--home".into(), self.home.clone().into_os_string(), "--spec".into(), spec.into()]
    }

    /// The command that starts the copy through this binary's launcher.
    /// The caller adds env, session and output. Like the daemon's other
    /// processes it runs `/proc/self/exe` (a binary that install.sh renamed
    /// over ours is another file) with the installed path as argv[0]. It
    /// starts in `/`: the launcher enters the app folder itself, so a folder
    /// that is gone is reported in the copy's log, not as a failed spawn.
    pub fn command(&self) -> std::io::Result<Command> {
        let exe = std::env::current_exe()?;
        let installed = exe.to_string_lossy();
        let mut cmd = Command::new("/proc/self/exe");
        cmd.arg0(installed.strip_suffix(" (deleted)").unwrap_or(&installed)).arg("launch").args(self.args()).current_dir("/");
        Ok(cmd)
    }

    /// Parses the launcher's arguments (those after `launch`): `--home HOME
    /// --spec JSON`, or the per-setting arguments of a launcher the build
    /// before the start spec started (a daemon adopts such a copy after an
    /// upgrade: see `legacy.rs`).
    pub fn parse(args: &[OsString]) -> Result<Launch, BadLaunchArgs> {
        let pairs = legacy::pairs(args)?;
        let one = |key: &str| pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v);
        let Some(spec) = one("--spec") else {
            return if one("--app-dir").is_some() { legacy::parse(&pairs) } else { Err(BadLaunchArgs::Missing("--spec".into())) };
        };
        let home = one("--home").ok_or_else(|| BadLaunchArgs::Missing("--home".into()))?;
        if let Some((k, _)) = pairs.iter().find(|(k, _)| k != "--home" && k != "--spec") {
            return Err(BadLaunchArgs::Unexpected(k.clone()));
        }
        let bad = |why: String| BadLaunchArgs::Value { key: "--spec".into(), why };
        let spec = spec.to_str().ok_or_else(|| bad("not UTF-8".into()))?;
        let launch: Launch = serde_json::from_str(spec).map_err(|e| bad(e.to_string()))?;
        Ok(Launch { home: PathBuf::from(home), ..launch })
    }
}

/// Why [`Launch::parse`] refused the launcher's arguments (the launcher
/// says it and exits; the daemon's orphan scan skips such a process).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadLaunchArgs {
    /// An argument that is no `--key`, or a key the launcher does not take.
    #[error("unexpected argument {0}")]
    Unexpected(String),
    /// A `--key` at the end, with no value after it.
    #[error("{0} has no value")]
    NoValue(String),
    /// A key the launcher needs is not there.
    #[error("{0} is missing")]
    Missing(String),
    /// A key's value cannot be read.
    #[error("{key}: {why}")]
    Value {
        /// The key.
        key: String,
        /// What is wrong with its value.
        why: String,
    },
}

/// Removes a copy's scratch disk and what its launcher kept beside it (its
/// isolation report, its /tmp and /dev/shm folders, and the image of its
/// disk of its own, unmounted first), for a copy that is forgotten. Each is
/// renamed aside at once (a hidden name, so a new copy of the same number
/// starts empty) and deleted on a thread of its own: a scratch disk of many
/// gigabytes must not hold up the daemon's cycle, which calls this under
/// its lock. The returned threads are for tests to wait on.
pub fn remove_scratch(scratch: &Path) -> Vec<std::thread::JoinHandle<()>> {
    // A disk of its own is unmounted first (a mount point cannot be
    // renamed); its image goes with the rest.
    let mut threads = detach_disk(scratch);
    threads.extend(
        disk::folders(scratch)
            .into_iter()
            .chain([report_path(scratch), disk::image_path(scratch)])
            .filter_map(|p| crate::home::remove_later(&p)),
    );
    threads
}

/// Unmounts a copy's disk of its own (its scratch folder, /tmp and
/// /dev/shm), keeping its image: [`disk::detach_below`] of each.
pub fn detach_disk(scratch: &Path) -> Vec<std::thread::JoinHandle<()>> {
    disk::folders(scratch).iter().flat_map(|p| disk::detach_below(p)).collect()
}

/// Removes an app's folder of its copies' disks (`scratch/<group>-<name>`)
/// without holding up the caller, their disks unmounted first (their loop
/// devices go with the last mount): a deleted app's, or one no app has.
pub fn remove_app_scratch(dir: &Path) {
    drop(disk::detach_below(dir));
    drop(crate::home::remove_later(dir));
}

/// Quotes a string for an R single-quoted literal.
pub fn r_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('\'');
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("\\'"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

/// How the copy's log line begins when the launcher could not launch it.
pub const LAUNCH_FAILED_LINE: &str = "--- shinyctl: the copy could not be launched:";

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Launch {
        Launch {
            home: "/home/u/.shinyctl".into(),
            app: "hello".into(),
            copy: 2,
            port: 20001,
            app_dir: "/srv/apps/it's here".into(),
            scratch: "/home/u/.shinyctl/scratch/default-hello/2".into(),
            uid: None,
            cgroups: vec!["/sys/fs/cgroup/memory/shinyctl-1/hello-2".into(), "/sys/fs/cgroup/pids/shinyctl-1/hello-2".into()],
            start: StartSpec {
                working_dir: "/srv/apps/it's here".into(),
                entrypoint: "app.R".into(),
                r_path: "/opt/R/4.4/bin/R".into(),
                env: Default::default(),
                sandbox: crate::manifest::Sandbox { writable_paths: vec!["/srv/data".into()], ..Default::default() },
                run_as: Some("shiny".into()),
            },
            pool: Some("/home/u/.shinyctl/pool/zygote.sock".into()),
            cold: Some("TZ is set in env".into()),
        }
    }

    #[test]
    fn arguments_round_trip() {
        let l = sample();
        assert_eq!(Launch::parse(&l.args()), Ok(l));
    }

    #[test]
    fn the_env_stays_off_the_command_line() {
        let mut l = sample();
        l.start.env.insert("DB_PASSWORD".into(), "s3cret".into());
        let args = l.args();
        assert!(args.iter().all(|a| !a.to_string_lossy().contains("s3cret")), "{args:?}");
        assert_eq!(Launch::parse(&args), Ok(sample()));
    }

    #[test]
    fn the_command_runs_this_binary_with_launch_first() {
        let cmd = sample().command().expect("current_exe");
        assert_eq!(cmd.get_program(), "/proc/self/exe");
        let args: Vec<_> = cmd.get_args().collect();
        assert_eq!(args[0], "launch");
        assert_eq!(&args[1..3], ["--home", "/home/u/.shinyctl"], "--home stays in the argv: the mark of the home's processes");
        assert_eq!(cmd.get_current_dir(), Some(Path::new("/")));
        assert_eq!(Launch::parse(&args[1..].iter().map(|a| a.to_os_string()).collect::<Vec<_>>()), Ok(sample()));
    }

    #[test]
    fn bad_arguments_are_refused_with_the_reason() {
        let mut args = sample().args();
        args[3] = args[3].to_string_lossy().replace("20001", "70000").into();
        let e = Launch::parse(&args).unwrap_err();
        let e = e.to_string();
        assert!(e.contains("--spec") && e.contains("70000"), "{e}");
        let e = Launch::parse(&args[2..]).unwrap_err().to_string();
        assert!(e.contains("--home"), "{e}");
        assert!(Launch::parse(&["--bogus".into()]).is_err());
        let mut extra = sample().args();
        extra.extend(["--port".into(), "1".into()]);
        assert!(Launch::parse(&extra).unwrap_err().to_string().contains("--port"));
    }

    #[test]
    fn a_launcher_the_build_before_started_is_read_for_adoption() {
        let args: Vec<OsString> = [
            "--app-dir", "/srv/apps/it's here", "--scratch", "/home/u/.shinyctl/scratch/default-hello/2", "--entrypoint", "app.R",
            "--port", "20001", "--r-path", "/opt/R/4.4/bin/R", "--copy", "2", "--app", "hello", "--home", "/home/u/.shinyctl",
            "--sandbox", r#"{"mode":"on","memory":null,"tasks":512,"open-files":4096,"writable-paths":["/srv/data"],"hidden-paths":[],"syscalls":"default"}"#,
            "--run-as", "shiny", "--cgroup", "/sys/fs/cgroup/memory/shinyctl-1/hello-2", "--cgroup", "/sys/fs/cgroup/pids/shinyctl-1/hello-2",
        ]
        .iter()
        .map(OsString::from)
        .collect();
        let mut want = sample();
        // The old command line did not name working-dir (app-dir is what
        // runs), nor the pool.
        want.start.working_dir = PathBuf::new();
        (want.pool, want.cold) = (None, None);
        assert_eq!(Launch::parse(&args), Ok(want));
        let e = Launch::parse(&args[2..]).unwrap_err().to_string();
        assert!(e.contains("--spec"), "{e}");
        let at = args.iter().position(|a| a == "--home").unwrap();
        let no_home: Vec<OsString> = args.iter().enumerate().filter(|(i, _)| *i != at && *i != at + 1).map(|(_, a)| a.clone()).collect();
        assert_eq!(Launch::parse(&no_home), Err(BadLaunchArgs::Missing("--home".into())));
    }

    #[test]
    fn r_strings_are_quoted() {
        assert_eq!(r_string("/a/b's\\c"), "'/a/b\\'s\\\\c'");
        assert_eq!(r_string("a\nb"), "'a\\nb'");
    }

    #[test]
    fn removing_a_scratch_disk_takes_what_the_launcher_kept_beside_it() {
        let tmp_dir = tempfile::tempdir().unwrap();
        let dir = tmp_dir.path().to_path_buf();
        let scratch = dir.join("3");
        for d in [scratch.join("sub"), disk::tmp_path(&scratch), disk::shm_path(&scratch), dir.join("4")] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(report_path(&scratch), "{}").unwrap();
        remove_scratch(&scratch).into_iter().for_each(|t| t.join().unwrap());
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left, vec![std::ffi::OsString::from("4")], "only another copy's disk is left");
    }
}
