//! shinyctl: one binary, three processes — the command, the daemon
//! (`shinyctl serve`) and the load balancer (`shinyctl proxy`).

use shinyctl::{cli, home, launcher, proxy, serve, wire};

use clap::{CommandFactory, Parser, Subcommand};

/// Run R Shiny apps on a machine of your own.
#[derive(Parser)]
#[command(name = "shinyctl", version = wire::BUILD, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Every subcommand.
#[derive(Subcommand)]
enum Command {
    /// Apply a manifest: start the app, or change it to match.
    Apply {
        /// The manifest (YAML).
        #[arg(short = 'f', long = "file")]
        file: std::path::PathBuf,
        /// Stop what is replaced or removed at once, without draining.
        #[arg(long)]
        now: bool,
        /// Wait until the new copies serve (exit 0), or fail or time out (non-zero, with the copy's last error); TIMEOUT defaults to 5m.
        #[arg(long, value_name = "TIMEOUT", num_args = 0..=1, require_equals = true, default_missing_value = cli::wait::DEFAULT_TIMEOUT, value_parser = cli::wait::timeout)]
        wait: Option<std::time::Duration>,
    },
    /// Show every app's copies, or one app's.
    Status {
        /// Only this app.
        app: Option<String>,
        /// The same facts as JSON, for scripts.
        #[arg(long, conflicts_with = "watch")]
        json: bool,
        /// Redraw the table every second until interrupted, as `watch` would.
        #[arg(short = 'w', long)]
        watch: bool,
        /// More columns: each copy's uptime, CPU percent, CPU time and memory limit.
        #[arg(long, conflicts_with = "json")]
        wide: bool,
    },
    /// Start new copies from the manifest as it is now; the old ones drain.
    Restart {
        /// The app.
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        app: Option<String>,
        /// Every app, one after the other.
        #[arg(long)]
        all: bool,
        /// Stop the old copies as soon as the new ones are ready.
        #[arg(long)]
        now: bool,
        /// Wait until the new copies serve (exit 0), or fail or time out (non-zero, with the copy's last error); TIMEOUT defaults to 5m.
        #[arg(long, value_name = "TIMEOUT", num_args = 0..=1, require_equals = true, default_missing_value = cli::wait::DEFAULT_TIMEOUT, value_parser = cli::wait::timeout)]
        wait: Option<std::time::Duration>,
    },
    /// Redeploy the last release that served before the current one (or --to ID), with the settings it was deployed with; the old copies drain.
    Rollback {
        /// The app.
        app: String,
        /// This kept release (`shinyctl releases APP` lists them), not the last that served.
        #[arg(long, value_name = "ID")]
        to: Option<String>,
        /// Stop the old copies as soon as the new ones are ready.
        #[arg(long)]
        now: bool,
        /// Wait until the new copies serve (exit 0), or fail or time out (non-zero, with the copy's last error); TIMEOUT defaults to 5m.
        #[arg(long, value_name = "TIMEOUT", num_args = 0..=1, require_equals = true, default_missing_value = cli::wait::DEFAULT_TIMEOUT, value_parser = cli::wait::timeout)]
        wait: Option<std::time::Duration>,
    },
    /// Stop an app's copies; its port answers that it is stopped until `start`.
    Stop {
        /// The app.
        app: String,
    },
    /// Start an app that `stop` stopped.
    Start {
        /// The app.
        app: String,
    },
    /// Set an app's replicas (its active copies) until its manifest is applied again.
    Scale {
        /// The app.
        app: String,
        /// The number of active copies.
        replicas: u32,
    },
    /// Print the apps' names, one a line.
    List,
    /// List an app's kept releases: when taken, size, served or failed, which is current.
    Releases {
        /// The app.
        app: String,
    },
    /// Stop this home's daemon; the load balancer and the copies keep running.
    Shutdown {
        /// Also stop the load balancer and every copy.
        #[arg(long)]
        all: bool,
    },
    /// Apply every registered manifest again from its path, as apply would (systemd's ExecReload).
    Reload,
    /// Stop an app's copies and forget it.
    Delete {
        /// The app.
        app: String,
        /// Stop every copy at once, without draining.
        #[arg(long)]
        now: bool,
    },
    /// Print the app's copies' logs, each line prefixed with its copy.
    Logs {
        /// The app.
        app: String,
        /// Only this copy (default: every copy the app has now, in start order).
        #[arg(long)]
        copy: Option<u32>,
        /// Also the copies that ended.
        #[arg(long, conflicts_with = "copy")]
        all: bool,
        /// The last N lines of each copy's log.
        #[arg(short = 'n', long = "tail", value_name = "N", default_value_t = cli::logs::DEFAULT_TAIL)]
        tail: usize,
        /// Keep printing as the logs grow, and the logs of copies that start.
        #[arg(short = 'f', long)]
        follow: bool,
    },
    /// Run the daemon (shinyctl-api).
    Serve {
        /// Detach: start the daemon in the background and return once it answers.
        #[arg(short = 'd', long)]
        detach: bool,
    },
    /// Run the load balancer (started by serve, not by people).
    #[command(hide = true)]
    Proxy,
    /// Start one copy: prepare its world, then exec R (started by serve).
    #[command(hide = true, disable_help_flag = true)]
    Launch {
        /// The launcher's own arguments, parsed by the launcher.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// Remove what a copy wrote as one of the daemon's subordinate ids
    /// (started by serve).
    #[command(hide = true, disable_help_flag = true)]
    Reclaim {
        /// FIRST COUNT PATH…, parsed by the reclaim.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// Print the version.
    Version,
    /// Print a shell completion script (install.sh installs it).
    Completions {
        /// bash, zsh or fish.
        shell: Shell,
    },
    /// Print the man page, in roff (install.sh installs it as shinyctl(1)).
    #[command(hide = true)]
    Man,
}

/// The shells `completions` writes for.
#[derive(Clone, Copy, clap::ValueEnum)]
enum Shell {
    Bash,
    Zsh,
    Fish,
}

fn main() {
    let cli = Cli::parse();
    // The commands a person pipes (`status --watch | head`) end quietly when
    // the reader goes, as other command-line tools do, instead of panicking
    // on the write (Rust ignores SIGPIPE). The daemon, the load balancer and
    // the launcher keep ignoring it: a closed socket or pipe is an error
    // they handle.
    if !matches!(cli.command, Command::Serve { .. } | Command::Proxy | Command::Launch { .. } | Command::Reclaim { .. }) {
        // SAFETY: before any thread is started; SIG_DFL is a valid disposition.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    let home = home::Home::from_env();
    let result = match cli.command {
        Command::Apply { file, now, wait } => cli::apply::run(&home, &file, now, wait),
        Command::Status { app, json, watch, wide } => cli::status::run(&home, app.as_deref(), json, watch, wide),
        Command::Restart { app: Some(app), now, wait, .. } => cli::restart::run(&home, &app, now, wait),
        Command::Restart { app: None, now, wait, .. } => cli::operate::restart_all(&home, now, wait),
        Command::Stop { app } => cli::operate::run(&home, &app, "stop"),
        Command::Start { app } => cli::operate::run(&home, &app, "start"),
        Command::Scale { app, replicas } => cli::operate::scale(&home, &app, replicas),
        Command::List => cli::operate::list(&home),
        Command::Shutdown { all } => cli::operate::shutdown(&home, all),
        Command::Rollback { app, to, now, wait } => cli::rollback::run(&home, &app, now, to.as_deref(), wait),
        Command::Releases { app } => cli::rollback::list(&home, &app),
        Command::Reload => cli::reload::run(&home),
        Command::Delete { app, now } => cli::delete::run(&home, &app, now),
        Command::Logs { app, copy, all, tail, follow } => cli::logs::run(&home, &app, cli::logs::Choice { copy, all, tail, follow }),
        Command::Serve { detach: true } => serve::detach(&home),
        Command::Serve { detach: false } => serve::run(home),
        Command::Proxy => proxy::run(home),
        Command::Launch { args } => std::process::exit(launcher::main(&args)),
        Command::Reclaim { args } => std::process::exit(shinyctl::reclaim::main(&args)),
        Command::Version => {
            println!("shinyctl {}", wire::BUILD);
            Ok(())
        }
        Command::Completions { shell } => {
            let shell = match shell {
                Shell::Bash => clap_complete::Shell::Bash,
                Shell::Zsh => clap_complete::Shell::Zsh,
                Shell::Fish => clap_complete::Shell::Fish,
            };
            cli::completions::write(shell, Cli::command(), &mut std::io::stdout()).map_err(Into::into)
        }
        Command::Man => match cli::man::render(Cli::command(), &mut std::io::stdout()) {
            // `shinyctl man | head` is no failure.
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
            _ => Ok(()),
        },
    };
    if let Err(e) = result {
        eprintln!("shinyctl: {e:#}");
        std::process::exit(1);
    }
}
