//! Starting this binary's own processes: in a session of their own (so
//! they outlive the one that started them and their group can be
//! signalled), through `/proc/self/exe`.

use std::fs::OpenOptions;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use crate::home::Home;

/// Makes the command's process lead a session of its own (setsid): it does
/// not die with the daemon, and its whole process group can be signalled.
fn own_session(cmd: &mut Command) -> &mut Command {
    // SAFETY: setsid is async-signal-safe, as pre_exec requires.
    unsafe {
        cmd.pre_exec(|| {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            Ok(())
        })
    }
}

/// Starts this binary with one subcommand (`serve`, `proxy`) and extra
/// environment in its own session, in `/`, its output appended to api.log.
pub fn spawn_self(home: &Home, subcommand: &str, env: &[(&str, &str)]) -> anyhow::Result<std::process::Child> {
    let log = OpenOptions::new().create(true).append(true).open(home.api_log())?;
    // Run our own binary through /proc/self/exe: after install.sh renames a
    // new binary over ours, the path names another file (or none). argv[0]
    // stays the installed path, so the documented `pkill -f
    // '(^|/)shinyctl serve$'` still matches.
    let exe = std::env::current_exe()?;
    let installed = exe.to_string_lossy();
    let mut cmd = Command::new("/proc/self/exe");
    cmd.arg0(installed.strip_suffix(" (deleted)").unwrap_or(&installed))
        .arg(subcommand)
        .envs(env.iter().copied())
        .env("SHINYCTL_HOME", &home.root)
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    Ok(own_session(&mut cmd).spawn()?)
}
