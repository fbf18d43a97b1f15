//! R's start in a copy: the expression that runs the app by its layout,
//! and the exec of R with it on R's standard input.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use super::{fail, fds, log, r_string, CopyFolders, Identity, Launch, EXIT_NO_R};

/// The expression a copy runs (R reads it on its standard input, see
/// [`R_ARGS`]), for the app folder as the copy sees it, by the
/// entrypoint's layout (README, "Every Shiny layout"):
/// - `app.R` (or another `.R` file): `shiny::runApp` of that file;
/// - `server.R` or `ui.R`: `shiny::runApp` of its folder, which reads
///   `global.R`, `ui.R` and `server.R` as Shiny Server does;
/// - an R Markdown document (`runtime: shiny`): `rmarkdown::run`, which
///   renders it into R's temporary folder (on the copy's own disk), since
///   the release is read-only and keeps no mtimes for rmarkdown to compare
///   (and is not polled for changes: a release never changes).
pub fn run_app_expr(app_dir: &Path, entrypoint: &str, port: u16) -> String {
    let app = app_dir.join(entrypoint);
    let listen = format!("port = {port}L, host = '127.0.0.1', launch.browser = FALSE");
    let name = app.file_name().map(|n| n.to_string_lossy().to_ascii_lowercase()).unwrap_or_default();
    if name == "server.r" || name == "ui.r" {
        let dir = app.parent().unwrap_or(app_dir);
        format!("shiny::runApp(appDir = {}, {listen})", r_string(&dir.to_string_lossy()))
    } else if name.ends_with(".rmd") {
        let dir = app.parent().unwrap_or(app_dir);
        format!(
            "local({{ out <- file.path(tempdir(), 'rmarkdown'); dir.create(out, showWarnings = FALSE); \
             rmarkdown::run(file = {}, dir = {}, auto_reload = FALSE, shiny_args = list({listen}), \
             render_args = list(output_dir = out, intermediates_dir = out, knit_root_dir = {})) }})",
            r_string(&app.to_string_lossy()),
            r_string(&dir.to_string_lossy()),
            r_string(&dir.to_string_lossy())
        )
    } else {
        format!("shiny::runApp(appDir = {}, {listen})", r_string(&app.to_string_lossy()))
    }
}

/// Replaces this process with R, in the app folder, with the environment
/// the launcher got (the daemon cleaned it) and the copy's own variables.
pub(super) fn exec_r(launch: &Launch, seen: &CopyFolders, who: Option<&Identity>) -> i32 {
    if let Err(e) = std::env::set_current_dir(&seen.app_dir) {
        return fail(&format!("cannot enter the app folder {}: {e}", seen.app_dir.display()));
    }
    let run = run_app_expr(&seen.app_dir, &launch.start.entrypoint, launch.port);
    let mut r = Command::new(&launch.start.r_path);
    match run_input(&run) {
        Some(input) => r.args(R_ARGS).stdin(Stdio::from(input)),
        None => r.args(["--no-echo", "--no-restore", "-e", &run]).stdin(Stdio::null()),
    };
    r.env("SHINYCTL_SCRATCH", &seen.scratch);
    if let Some(tmp) = &seen.tmpdir {
        r.env("TMPDIR", tmp);
    }
    if let Some(who) = who {
        r.env("HOME", &who.home).env("USER", &who.name).env("LOGNAME", &who.name);
    }
    if let Some(libs) = &seen.r_libs_user {
        r.env("R_LIBS_USER", libs);
    }
    // Only 0, 1 and 2 reach R (the launcher's own pipes end here too).
    fds::cloexec_above_stdio();
    let err = r.exec();
    log(&format!("--- shinyctl: cannot run {}: {err} ---", launch.start.r_path));
    EXIT_NO_R
}

/// What follows R's path on a copy's command line. R reads the run
/// expression from its standard input ([`run_input`]), not from `-e`: R's
/// front script (`bin/R`) runs `sed` three times in two subshells on an
/// `-e` argument before R starts, a few milliseconds of every copy's start
/// and wake (README, "Benchmark"), and none on these three. `--no-save` is
/// what `-e` implied. No trailing arguments: an app that reads
/// `commandArgs(trailingOnly = TRUE)` finds none, as under `R -e`.
pub const R_ARGS: [&str; 3] = ["--no-echo", "--no-restore", "--no-save"];

/// The run expression as R's standard input: a pipe holding it whole, its
/// writing end closed, so R reads the expression and then the end (as
/// `/dev/null` would give it). `None` when it does not fit the pipe at
/// once (a pipe may hold as little as a page when its user has many): the
/// caller passes it with `-e` then.
fn run_input(run: &str) -> Option<std::os::fd::OwnedFd> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC).ok()?;
    // Never blocks: a full pipe is a short write, and the fallback.
    fcntl(std::os::fd::AsRawFd::as_raw_fd(&write), FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).ok()?;
    std::fs::File::from(write).write_all(format!("{run}\n").as_bytes()).ok()?;
    Some(read)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launcher::APP_DIR;

    #[test]
    fn r_reads_the_run_expression_from_a_pipe_that_holds_it_whole() {
        use std::io::Read;
        let fd = run_input("shiny::runApp(port = 1L)").expect("a short expression fits a pipe");
        let mut got = String::new();
        std::fs::File::from(fd).read_to_string(&mut got).unwrap();
        assert_eq!(got, "shiny::runApp(port = 1L)\n", "the expression, a newline, then the end");
        // More than a pipe holds: no pipe (and no blocking), -e instead.
        assert!(run_input(&"x".repeat(4 << 20)).is_none());
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
    fn each_layout_runs_as_shiny_server_runs_it() {
        assert_eq!(
            run_app_expr(Path::new(APP_DIR), "server.R", 20001),
            "shiny::runApp(appDir = '/shinyctl/app', port = 20001L, host = '127.0.0.1', launch.browser = FALSE)",
            "ui.R + server.R: the folder"
        );
        assert!(run_app_expr(Path::new(APP_DIR), "sub/ui.R", 1).starts_with("shiny::runApp(appDir = '/shinyctl/app/sub',"));
        let rmd = run_app_expr(Path::new(APP_DIR), "report.Rmd", 20001);
        assert!(rmd.contains("rmarkdown::run(file = '/shinyctl/app/report.Rmd'"), "{rmd}");
        assert!(rmd.contains("output_dir = out") && rmd.contains("tempdir()"), "rendered on the copy's own disk: {rmd}");
    }
}
