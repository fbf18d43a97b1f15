//! `shinyctl man`: the man page, shinyctl(1), in roff. One page for every
//! visible command (synopsis, what it does, its options), then the
//! manifest's keys, the files, the environment and the exit status. The
//! keys are those the manifest reads (`manifest::KEYS`, `SANDBOX_KEYS`),
//! described by the README's table of them, as the files are by its
//! "Files" table: the page cannot drift from either.

use std::io::Write;

use clap::{Arg, ArgAction};
use clap_mangen::roff::{bold, italic, roman, Inline, Roff};

use super::completions::visible;

/// The README, whose "The manifest" and "Files" tables the page shows.
const README: &str = include_str!("../../README.md");

/// The variables shinyctl reads, and those it gives an app's copies.
const ENVIRONMENT: [(&str, &str); 12] = [
    ("SHINYCTL_HOME", "The home folder: its daemon, apps, logs and releases (default ~/.shinyctl). Every command talks to the daemon of this home."),
    ("HOME", "Where ~/.shinyctl is, when SHINYCTL_HOME is not set."),
    ("SHINYCTL_LOG", "How much api.log says (default info): a level such as debug, or module=level pairs such as info,shinyctl::proxy=debug. Read by shinyctl serve; the load balancer it starts inherits it."),
    ("SHINYCTL_METRICS", "ADDR:PORT, such as 127.0.0.1:9108: shinyctl serve also answers GET /metrics and GET /v1/health there, over TCP, for Prometheus."),
    ("SHINYCTL_MAX_MEMORY", "A size such as 8G: shinyctl serve grows no app (max-replicas) past it, counting every copy it runs; default 80% of the machine's memory."),
    ("SHINYCTL_CGROUPS", "off: shinyctl serve gives the copies no cgroup; it watches their memory itself, and sandbox.tasks is not kept."),
    ("SHINYCTL_POOL", "off: shinyctl serve keeps no pool; every copy starts R cold (see pool in MANIFEST)."),
    ("SHINYCTL_IDS", "The file that records each app's own uid (default /var/lib/shinyctl/ids.json for a root daemon, ~/.local/state/shinyctl/ids.json otherwise)."),
    ("SHINYCTL_POOL_MEMORY", "A size such as 512M: the memory limit of the pool's zygote (its cgroup), default 1G."),
    ("NOTIFY_SOCKET", "Set by systemd for a Type=notify unit: shinyctl serve sends READY=1 there once its API answers, and STOPPING=1 when it stops."),
    ("SHINYCTL_COPY", "Given to each copy of an app: its copy number, from 1."),
    ("SHINYCTL_SCRATCH", "Given to each copy of an app: the copy's own disk, writable, kept through sleep, empty after a redeploy."),
];

/// The exit statuses, as every command has them.
const EXIT_STATUS: [(&str, &str); 3] = [
    ("0", "Done. apply, restart and rollback exit once the daemon has taken the change (the new copies then start and take over, or not: status says which); with --wait, once the new copies serve."),
    ("1", "It failed; a line on standard error, after shinyctl:, says why (a bad manifest names its file, line and key). reload exits 1 when any manifest could not be applied; apply, restart and rollback with --wait when a new copy ended before it was ready or the time ran out (the version before still serves)."),
    ("2", "The command line is wrong: an unknown command or option, or a missing argument; the usage is printed."),
];

/// Writes the page for `cmd` (the whole command line) to `w`.
pub fn render(cmd: clap::Command, w: &mut dyn Write) -> std::io::Result<()> {
    let mut cmd = visible(cmd);
    cmd.build();
    let mut page = Roff::new();
    let version = cmd.get_version().unwrap_or_default().to_string();
    page.control("TH", ["SHINYCTL", "1", "", &format!("shinyctl {version}"), "User Commands"]);
    page.control("SH", ["NAME"]);
    page.text([roman(format!("shinyctl - {}", text_of(cmd.get_about())))]);
    synopsis_section(&mut page, &cmd);
    page.control("SH", ["DESCRIPTION"]);
    page.text([roman(
        "shinyctl runs R Shiny apps: each app's copies, a load balancer in front of them with sticky sessions, \
         and shinyctl serve, the daemon that keeps them up. The commands talk to the daemon of their home \
         (SHINYCTL_HOME) over its socket; apply starts it when it is not running. An app is described by a \
         manifest, a YAML file (see MANIFEST).",
    )]);
    commands_section(&mut page, &cmd);
    page.control("SH", ["GLOBAL OPTIONS"]);
    for arg in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
        option_item(&mut page, arg);
    }
    manifest_section(&mut page);
    files_section(&mut page);
    list_section(&mut page, "ENVIRONMENT", &ENVIRONMENT);
    list_section(&mut page, "EXIT STATUS", &EXIT_STATUS);
    page.control("SH", ["VERSION"]);
    page.text([roman(version)]);
    page.to_writer(w)
}

/// SYNOPSIS: one line for every command.
fn synopsis_section(page: &mut Roff, cmd: &clap::Command) {
    page.control("SH", ["SYNOPSIS"]);
    page.text([bold("shinyctl"), roman(" [-h|--help] [-V|--version] "), italic("COMMAND"), roman(" ...")]);
    for sub in commands(cmd) {
        page.control("br", []);
        page.text(usage(sub));
    }
}

/// COMMANDS: each command's usage, what it does, and its options.
fn commands_section(page: &mut Roff, cmd: &clap::Command) {
    page.control("SH", ["COMMANDS"]);
    for sub in commands(cmd) {
        page.control("TP", []);
        page.text(usage(sub));
        page.text([roman(sentence(&text_of(sub.get_long_about().or(sub.get_about()))))]);
        let args: Vec<&Arg> = sub.get_arguments().filter(|a| !a.is_hide_set() && a.get_id() != "help").collect();
        if args.is_empty() {
            continue;
        }
        page.control("RS", []);
        for arg in args {
            option_item(page, arg);
        }
        page.control("RE", []);
    }
}

/// The visible commands, `help` left out (the page is the help).
fn commands(cmd: &clap::Command) -> impl Iterator<Item = &clap::Command> {
    cmd.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help")
}

/// A command's usage: `shinyctl NAME`, then each argument as it is typed.
fn usage(sub: &clap::Command) -> Vec<Inline> {
    let mut line = vec![bold(format!("shinyctl {}", sub.get_name()))];
    for arg in sub.get_arguments().filter(|a| !a.is_hide_set() && a.get_id() != "help") {
        let value = value_name(arg);
        let shown = match (arg.is_positional(), arg.get_long(), arg.get_short()) {
            (true, ..) => value,
            (false, long, short) => {
                let names: Vec<String> = short.map(|s| format!("-{s}")).into_iter().chain(long.map(|l| format!("--{l}"))).collect();
                let names = names.join("|");
                match takes_value(arg) {
                    false => names,
                    true if optional_value(arg) => format!("{names}[={value}]"),
                    true => format!("{names} {value}"),
                }
            }
        };
        line.push(roman(" "));
        line.push(if arg.is_required_set() { roman(shown) } else { roman(format!("[{shown}]")) });
    }
    line
}

/// One option or argument under its command: its names, then its help,
/// default and allowed values.
fn option_item(page: &mut Roff, arg: &Arg) {
    let mut head = Vec::new();
    if let Some(s) = arg.get_short() {
        head.push(bold(format!("-{s}")));
    }
    if let Some(l) = arg.get_long() {
        if !head.is_empty() {
            head.push(roman(", "));
        }
        head.push(bold(format!("--{l}")));
    }
    if arg.is_positional() {
        head.push(italic(value_name(arg)));
    } else if takes_value(arg) {
        head.push(roman(" "));
        head.push(italic(value_name(arg)));
    }
    page.control("TP", []);
    page.text(head);
    let mut help = sentence(&text_of(arg.get_long_help().or(arg.get_help())));
    let possible: Vec<String> = arg.get_possible_values().iter().filter(|v| !v.is_hide_set()).map(|v| v.get_name().to_string()).collect();
    if arg.is_positional() && !possible.is_empty() {
        help.push_str(&format!(" One of: {}.", possible.join(", ")));
    }
    // A flag's default (false) says nothing; a help that gives it, enough.
    let defaults: Vec<String> = arg.get_default_values().iter().map(|v| v.to_string_lossy().into_owned()).collect();
    if takes_value(arg) && !defaults.is_empty() && !help.contains("default") {
        help.push_str(&format!(" Default: {}.", defaults.join(", ")));
    }
    page.text([roman(help.trim().to_string())]);
}

/// The name a value is shown by: the argument's value name, or its id.
fn value_name(arg: &Arg) -> String {
    match arg.get_value_names() {
        Some(names) if !names.is_empty() => names.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(" "),
        _ => arg.get_id().as_str().to_uppercase(),
    }
}

/// True when the option takes a value (not a flag).
fn takes_value(arg: &Arg) -> bool {
    matches!(arg.get_action(), ArgAction::Set | ArgAction::Append)
}

/// True when the option's value may be left out (`--wait` or `--wait=10s`).
fn optional_value(arg: &Arg) -> bool {
    arg.get_num_args().is_some_and(|n| n.min_values() == 0)
}

/// A help text as a sentence: with its full stop.
fn sentence(text: &str) -> String {
    match text.chars().last() {
        None => String::new(),
        Some('.' | '!' | '?' | ')') => text.to_string(),
        Some(_) => format!("{text}."),
    }
}

/// Help text as plain text, one line.
fn text_of(s: Option<&clap::builder::StyledStr>) -> String {
    s.map(|s| s.to_string().split_whitespace().collect::<Vec<_>>().join(" ")).unwrap_or_default()
}

/// MANIFEST: every key the manifest reads, with its default and what it
/// takes, from the README's table.
fn manifest_section(page: &mut Roff) {
    page.control("SH", ["MANIFEST"]);
    page.text([roman(
        "A manifest is a YAML file with one app's keys; shinyctl apply -f FILE applies it. Relative paths \
         in it are relative to its folder. Its keys, each with its default:",
    )]);
    let rows = readme_table("## The manifest");
    for key in manifest_keys() {
        let row = rows.iter().find(|r| r.first() == Some(&key));
        let default = row.map_or(String::new(), |r| cell(r, 1));
        page.control("TP", []);
        page.text([bold(key.clone()), roman(if default == "required" { " (required)".into() } else { format!(" (default: {default})") })]);
        let notes = row.map_or("See the README, \"The manifest\".".to_string(), |r| sentence(&cell(r, 2)));
        page.text([roman(notes)]);
    }
}

/// Every key a manifest may hold: the top-level ones, then `sandbox.KEY`.
pub fn manifest_keys() -> Vec<String> {
    let top = crate::manifest::KEYS.iter().map(|k| k.to_string());
    top.chain(crate::manifest::SANDBOX_KEYS.iter().map(|k| format!("sandbox.{k}"))).collect()
}

/// FILES: the home folder's files, from the README's table.
fn files_section(page: &mut Roff) {
    page.control("SH", ["FILES"]);
    page.text([roman(
        "Everything shinyctl keeps is under ~/.shinyctl/ (or $SHINYCTL_HOME), except each app's state.json, \
         which is where its manifest's state-file says (beside the manifest by default).",
    )]);
    for row in readme_table("## Files") {
        page.control("TP", []);
        page.text([bold(format!("~/.shinyctl/{}", cell(&row, 0)))]);
        page.text([roman(cell(&row, 1))]);
    }
}

/// A section of name and meaning pairs.
fn list_section(page: &mut Roff, title: &str, items: &[(&str, &str)]) {
    page.control("SH", [title]);
    for (name, meaning) in items {
        page.control("TP", []);
        page.text([bold(*name)]);
        page.text([roman(*meaning)]);
    }
}

/// A row's cell `i`, empty when it has none.
fn cell(row: &[String], i: usize) -> String {
    row.get(i).cloned().unwrap_or_default()
}

/// The rows (header left out) of the first table after the README's line
/// `heading`, each cell as plain text.
pub fn readme_table(heading: &str) -> Vec<Vec<String>> {
    let Some(at) = README.lines().position(|l| l == heading) else { return Vec::new() };
    README
        .lines()
        .skip(at + 1)
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|l| l.trim().trim_matches('|').split('|').map(plain).collect())
        .collect()
}

/// Markdown as plain text: no backticks or emphasis, links as their text.
fn plain(md: &str) -> String {
    let mut out = String::new();
    let mut rest = md.trim();
    while let Some(open) = rest.find('[') {
        let link = rest[open..].find("](").and_then(|mid| rest[open + mid..].find(')').map(|end| (mid, open + mid + end)));
        let Some((mid, end)) = link else { break };
        out.push_str(&rest[..open]);
        out.push_str(&rest[open + 1..open + mid]);
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    out.replace('`', "").replace("**", "")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_manifest_key_has_its_row_in_the_readme_and_every_row_is_a_key() {
        let rows = readme_table("## The manifest");
        let keys = manifest_keys();
        for key in &keys {
            let row = rows.iter().find(|r| r.first() == Some(key));
            assert!(row.is_some_and(|r| r.len() == 3), "README's manifest table has a row for {key}: {rows:?}");
        }
        for row in &rows {
            assert!(keys.contains(&row[0]), "{} in the README is a key the manifest reads", row[0]);
        }
    }

    #[test]
    fn the_files_table_and_the_environment_are_the_readmes() {
        let files = readme_table("## Files");
        assert!(files.iter().any(|r| r[0] == "api.log") && files.iter().all(|r| r.len() == 2), "{files:?}");
        for (var, _) in ENVIRONMENT {
            assert!(README.contains(var), "the README says what {var} is");
        }
    }

    #[test]
    fn markdown_becomes_plain_text() {
        assert_eq!(plain(" `a` and [the docs](#x), **b** "), "a and the docs, b");
        assert_eq!(plain("[a](b) [c](d)"), "a c");
        assert_eq!(plain("x [y"), "x [y");
    }
}
