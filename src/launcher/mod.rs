//! The copy launcher: `shinyctl launch …` (hidden), through which every copy
//! starts. The daemon spawns it (in the copy's own session, env set, output
//! to the copy's log); it prepares the copy's world and then execs R, so the
//! PID the daemon records is R's.
//!
//! The world, best first:
//! - `mount-namespace`: a mount namespace of its own (inside a user
//!   namespace when the launcher is not privileged) whose root is a new
//!   tmpfs holding the host's top-level folders, the app folder read-only at
//!   [`APP_DIR`] (and at its host path), and the copy's scratch disk at
//!   [`SCRATCH_DIR`]. See `mount.rs`.
//! - `landlock`: no namespace could be made (user namespaces switched off);
//!   Landlock lets the copy write only to its scratch disk, /tmp and the
//!   devices R needs. See `landlock.rs`.
//! - `none`: neither; the copy runs as it did before the launcher.
//!
//! What the copy got is written to a small report file beside its scratch
//! disk ([`report_path`]), which the daemon reads for `status --json`.

mod landlock;
mod mount;
mod report;

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

pub use crate::model::{Isolation, IsolationKind};
pub use report::{read_report, report_path};

/// Where the app folder is inside the copy's mount namespace (its working
/// directory there).
pub const APP_DIR: &str = "/shinyctl/app";
/// Where the copy's scratch disk (`SHINYCTL_SCRATCH`) is inside its mount
/// namespace.
pub const SCRATCH_DIR: &str = "/shinyctl/scratch";

/// The launcher's exit status when it could not start the copy (bad
/// arguments, a mount that failed half-way): the copy's log says why.
pub const EXIT_LAUNCH_FAILED: i32 = 121;
/// The launcher's exit status when R itself could not be run.
pub const EXIT_NO_R: i32 = 127;

/// Everything the launcher needs to start one copy: the daemon builds it,
/// turns it into a command line ([`Launch::command`]), and the launcher
/// parses it back ([`Launch::parse`]).
#[derive(Debug, Clone, PartialEq, Eq, clap::Parser)]
#[command(name = "shinyctl launch", no_binary_name = true, disable_help_flag = true)]
pub struct Launch {
    /// The folder to run, as the host sees it (a release, or working-dir).
    #[arg(long)]
    pub app_dir: PathBuf,
    /// The copy's own disk, as the host sees it.
    #[arg(long)]
    pub scratch: PathBuf,
    /// The app's file in `app_dir` (`app.R`).
    #[arg(long)]
    pub entrypoint: String,
    /// The copy's port on 127.0.0.1.
    #[arg(long)]
    pub port: u16,
    /// The R executable.
    #[arg(long)]
    pub r_path: String,
    /// The copy number (for the log line).
    #[arg(long)]
    pub copy: u32,
}

impl Launch {
    /// The launcher's arguments after `launch`.
    pub fn args(&self) -> Vec<OsString> {
        let mut a: Vec<OsString> = Vec::with_capacity(12);
        let mut pair = |k: &str, v: OsString| {
            a.push(k.into());
            a.push(v);
        };
        pair("--app-dir", self.app_dir.clone().into_os_string());
        pair("--scratch", self.scratch.clone().into_os_string());
        pair("--entrypoint", self.entrypoint.clone().into());
        pair("--port", self.port.to_string().into());
        pair("--r-path", self.r_path.clone().into());
        pair("--copy", self.copy.to_string().into());
        a
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

    /// Parses the launcher's arguments (those after `launch`).
    pub fn parse(args: &[OsString]) -> Result<Launch, String> {
        use clap::Parser;
        Launch::try_parse_from(args).map_err(|e| e.to_string().trim_end().to_string())
    }
}

/// Removes a copy's scratch disk and what its launcher kept beside it (its
/// isolation report and its TMPDIR), for a copy that is forgotten.
pub fn remove_scratch(scratch: &Path) {
    let _ = std::fs::remove_dir_all(scratch);
    let _ = std::fs::remove_file(report_path(scratch));
    let _ = std::fs::remove_dir_all(landlock::tmp_path(scratch));
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

/// The `-e` expression a copy runs, for the app folder as the copy sees it.
pub fn run_app_expr(app_dir: &Path, entrypoint: &str, port: u16) -> String {
    let app = app_dir.join(entrypoint);
    format!("shiny::runApp(appDir = {}, port = {port}L, host = '127.0.0.1', launch.browser = FALSE)", r_string(&app.to_string_lossy()))
}

/// Which namespaces a copy gets. The fence adds PID, IPC and UTS here, and
/// sets `user_always`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Namespaces {
    /// A user namespace even when the launcher is privileged (root): then a
    /// root copy keeps no capability on the host. Off for now: as root a
    /// mount namespace alone is made.
    pub user_always: bool,
}

/// The folders a copy sees once its world is made: inside the namespace,
/// the fixed paths; otherwise the host's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// The app folder (the working directory).
    pub app_dir: PathBuf,
    /// The scratch disk (`SHINYCTL_SCRATCH`).
    pub scratch: PathBuf,
    /// R's TMPDIR, when /tmp is not the copy's to write to.
    pub tmpdir: Option<PathBuf>,
}

/// `shinyctl launch ARGS`: prepares the copy's world and execs R; returns
/// only on failure, with the exit status to use.
pub fn main(args: &[OsString]) -> i32 {
    let launch = match Launch::parse(args) {
        Ok(l) => l,
        Err(e) => return fail(&format!("bad arguments: {e}")),
    };
    // Opened before the namespace hides the host's paths. Without it the
    // copy still runs; only status lacks the field.
    let report = report::Writer::open(&report_path(&launch.scratch))
        .map_err(|e| log(&format!("--- shinyctl: no isolation report beside {}: {e} ---", launch.scratch.display())))
        .ok();
    let (isolation, seen) = match prepare(&launch, Namespaces::default()) {
        Ok(v) => v,
        Err(e) => return fail(&format!("{e:#}")),
    };
    if let Some(report) = report {
        report.write(&isolation);
    }
    log(&isolation_line(&isolation, &seen));
    exec_r(&launch, &seen)
}

/// Makes the copy's world: a mount namespace where one can be made, else
/// Landlock, else nothing. An error is a failure half-way (the copy must
/// not start).
fn prepare(launch: &Launch, ns: Namespaces) -> anyhow::Result<(Isolation, Seen)> {
    let app_dir = std::fs::canonicalize(&launch.app_dir)
        .map_err(|e| anyhow::anyhow!("the app folder {} cannot be opened: {e}", launch.app_dir.display()))?;
    let scratch = std::fs::canonicalize(&launch.scratch)
        .map_err(|e| anyhow::anyhow!("the scratch disk {} cannot be opened: {e}", launch.scratch.display()))?;
    let no_ns = match mount::enter(&app_dir, &scratch, ns)? {
        mount::Entered::Yes => {
            let seen = Seen { app_dir: APP_DIR.into(), scratch: SCRATCH_DIR.into(), tmpdir: None };
            return Ok((Isolation { kind: IsolationKind::MountNamespace, reason: None }, seen));
        }
        mount::Entered::Unavailable(why) => why,
    };
    let mut seen = Seen { app_dir, scratch, tmpdir: None };
    let isolation = match landlock::restrict(&seen.scratch, &seen.app_dir) {
        Ok(tmpdir) => {
            seen.tmpdir = tmpdir;
            Isolation { kind: IsolationKind::Landlock, reason: Some(format!("no mount namespace: {no_ns}")) }
        }
        Err(why) => Isolation { kind: IsolationKind::None, reason: Some(format!("no mount namespace: {no_ns}; no Landlock: {why}")) },
    };
    Ok((isolation, seen))
}

/// The line the copy's log gets before R starts: what isolation it got and
/// where the app may write.
fn isolation_line(isolation: &Isolation, seen: &Seen) -> String {
    let how = match isolation.kind {
        IsolationKind::MountNamespace => "mount namespace".to_string(),
        IsolationKind::Landlock => format!("Landlock ({})", isolation.reason.as_deref().unwrap_or("")),
        IsolationKind::None => format!("none ({})", isolation.reason.as_deref().unwrap_or("")),
    };
    let folder = match isolation.kind {
        IsolationKind::None => "should be treated as read-only",
        _ => "is read-only",
    };
    format!(
        "--- shinyctl: isolation: {how}. The app's folder {} {folder}: write to SHINYCTL_SCRATCH ({}) or to a path outside set in env ---",
        seen.app_dir.display(),
        seen.scratch.display()
    )
}

/// Replaces this process with R. The fence puts its init here: it forks,
/// the child execs R, and this process stays as PID 1 of the copy's PID
/// namespace (forwarding SIGTERM, reaping, reporting R's end).
fn exec_r(launch: &Launch, seen: &Seen) -> i32 {
    if let Err(e) = std::env::set_current_dir(&seen.app_dir) {
        return fail(&format!("cannot enter the app folder {}: {e}", seen.app_dir.display()));
    }
    let mut r = Command::new(&launch.r_path);
    r.args(["--no-echo", "--no-restore", "-e", &run_app_expr(&seen.app_dir, &launch.entrypoint, launch.port)])
        .env("SHINYCTL_SCRATCH", &seen.scratch)
        .stdin(Stdio::null());
    if let Some(tmp) = &seen.tmpdir {
        r.env("TMPDIR", tmp);
    }
    let err = r.exec();
    log(&format!("--- shinyctl: cannot run {}: {err} ---", launch.r_path));
    EXIT_NO_R
}

/// Writes one line to the copy's log (the launcher's stderr).
fn log(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// Logs why the copy could not be launched; returns the exit status.
fn fail(why: &str) -> i32 {
    log(&format!("--- shinyctl: the copy could not be launched: {why} ---"));
    EXIT_LAUNCH_FAILED
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Launch {
        Launch {
            app_dir: "/srv/apps/it's here".into(),
            scratch: "/home/u/.shinyctl/scratch/default-hello/2".into(),
            entrypoint: "app.R".into(),
            port: 20001,
            r_path: "/opt/R/4.4/bin/R".into(),
            copy: 2,
        }
    }

    #[test]
    fn arguments_round_trip() {
        let l = sample();
        assert_eq!(Launch::parse(&l.args()), Ok(l));
    }

    #[test]
    fn the_command_runs_this_binary_with_launch_first() {
        let cmd = sample().command().expect("current_exe");
        assert_eq!(cmd.get_program(), "/proc/self/exe");
        let args: Vec<_> = cmd.get_args().collect();
        assert_eq!(args[0], "launch");
        assert_eq!(cmd.get_current_dir(), Some(Path::new("/")));
        assert_eq!(Launch::parse(&args[1..].iter().map(|a| a.to_os_string()).collect::<Vec<_>>()), Ok(sample()));
    }

    #[test]
    fn bad_arguments_are_refused_with_the_reason() {
        let mut args = sample().args();
        let i = args.iter().position(|a| a == "--port").unwrap();
        args[i + 1] = "70000".into();
        let e = Launch::parse(&args).unwrap_err();
        assert!(e.contains("--port"), "{e}");
        let missing: Vec<OsString> = sample().args().into_iter().take(4).collect();
        let e = Launch::parse(&missing).unwrap_err();
        assert!(e.contains("--entrypoint"), "{e}");
        assert!(Launch::parse(&["--bogus".into()]).is_err());
    }

    #[test]
    fn r_strings_are_quoted() {
        assert_eq!(r_string("/a/b's\\c"), "'/a/b\\'s\\\\c'");
        assert_eq!(r_string("a\nb"), "'a\\nb'");
    }

    #[test]
    fn the_run_app_expression_uses_the_path_the_copy_sees() {
        assert_eq!(
            run_app_expr(Path::new(APP_DIR), "app.R", 20001),
            "shiny::runApp(appDir = '/shinyctl/app/app.R', port = 20001L, host = '127.0.0.1', launch.browser = FALSE)"
        );
        assert!(run_app_expr(Path::new("/srv/it's"), "app.R", 1).contains("'/srv/it\\'s/app.R'"));
    }

    #[test]
    fn the_log_line_says_where_to_write() {
        let seen = Seen { app_dir: APP_DIR.into(), scratch: SCRATCH_DIR.into(), tmpdir: None };
        let line = isolation_line(&Isolation { kind: IsolationKind::MountNamespace, reason: None }, &seen);
        assert!(line.contains("/shinyctl/app is read-only"), "{line}");
        assert!(line.contains("SHINYCTL_SCRATCH (/shinyctl/scratch)"), "{line}");
        assert!(!line.starts_with("--- shinyctl: copy"), "not taken for a start line");
    }

    #[test]
    fn removing_a_scratch_disk_takes_what_the_launcher_kept_beside_it() {
        let dir = std::env::temp_dir().join(format!("shinyctl-remove-scratch-{}", std::process::id()));
        let scratch = dir.join("3");
        for d in [scratch.join("sub"), landlock::tmp_path(&scratch), dir.join("4")] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(report_path(&scratch), "{}").unwrap();
        remove_scratch(&scratch);
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left, vec![std::ffi::OsString::from("4")], "only another copy's disk is left");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
