//! The manifest's unit tests: every key, every refusal with its file, line,
//! key and what is allowed, and the line-finding.

use super::*;

/// A temporary folder of its own, removed at the end of the test.
/// (The folder is held only for its removal on drop.)
pub(super) struct TestDir(pub(super) PathBuf, #[allow(dead_code)] tempfile::TempDir);

impl TestDir {
    pub(super) fn new() -> TestDir {
        let dir = tempfile::Builder::new().prefix("shinyctl-manifest-test-").tempdir().unwrap();
        let p = dir.path().to_path_buf();
        fs::write(p.join("app.R"), "library(shiny)\n").unwrap();
        TestDir(p, dir)
    }
    fn manifest(&self) -> PathBuf {
        self.0.join("hello.yaml")
    }
    pub(super) fn parse(&self, text: &str) -> Result<AppSpec, ManifestError> {
        parse(&self.manifest(), text)
    }
    /// Asserts `text` is refused at `line` for `key`, with each of `wants`
    /// in the message; returns the message.
    pub(super) fn refused(&self, text: &str, line: usize, key: &str, wants: &[&str]) -> String {
        let e = self.parse(text).expect_err("should be refused");
        let shown = e.to_string();
        let prefix = format!("{}:{line}: {key}: ", self.manifest().display());
        assert!(shown.starts_with(&prefix), "{shown:?} does not start with {prefix:?}");
        assert_eq!(e.line, Some(line), "{shown}");
        assert_eq!(e.key.as_deref(), Some(key), "{shown}");
        for w in wants {
            assert!(shown.contains(w), "{shown:?} lacks {w:?}");
        }
        shown
    }
}

use std::fs;

const MIN: &str = "app-name: hello\nport: 8080\n";

#[test]
fn defaults_are_filled() {
    let d = TestDir::new();
    let s = d.parse(MIN).unwrap();
    assert_eq!(s.name, "hello");
    assert_eq!(s.group, "default");
    assert_eq!(s.manifest, d.manifest());
    assert_eq!(s.start.working_dir, d.0);
    assert_eq!(s.start.entrypoint, "app.R");
    assert_eq!(s.route.port, 8080);
    assert_eq!(s.route.host.to_string(), "0.0.0.0");
    assert_eq!(s.scale.replicas, 1);
    assert_eq!(s.scale.warm_replicas, 1);
    assert_eq!(s.route.lb_policy, LbPolicy::LeastConn);
    assert_eq!(s.scale.drain_timeout_ms, 15 * 60 * 1000);
    assert_eq!(s.scale.restart_policy, RestartPolicy::Always);
    assert!(s.start.env.is_empty());
    assert_eq!(s.state_file, d.0.join("state.json"));
    assert_eq!(s.scale.idle_timeout_ms, 300_000);
    assert_eq!(s.route.request_timeout_ms, 30_000);
    assert_eq!(s.start.r_path, "R");
    assert_eq!(s.route.max_connections, DEFAULT_MAX_CONNECTIONS);
    assert!(s.route.trusted_proxies.is_empty());
}

#[test]
fn every_key_is_parsed() {
    let d = TestDir::new();
    fs::create_dir_all(d.0.join("src/www")).unwrap();
    fs::write(d.0.join("src/main.R"), "").unwrap();
    fs::create_dir_all(d.0.join("var")).unwrap();
    fs::create_dir_all(d.0.join("bin")).unwrap();
    fs::write(d.0.join("bin/R"), "#!/bin/sh\n").unwrap();
    let text = "\
# a comment
app-name: sales-2
app-group: team-a
working-dir: ./src
entrypoint-file: main.R
port: 8765
host: 127.0.0.1
replicas: 3
warm-replicas: 0
lb-policy: round-robin
drain-timeout: 1h
restart-policy: on-failure
env:
  DB_HOST: db.local
  WORKERS: 4
  VERSION: 1.10
  DEBUG: true
  EMPTY: \"\"
state-file: var/sales.json
idle-timeout: 0
request-timeout: 500ms
r-path: bin/R
";
    let s = d.parse(text).unwrap();
    assert_eq!(s.name, "sales-2");
    assert_eq!(s.group, "team-a");
    assert_eq!(s.start.working_dir, d.0.join("src"));
    assert_eq!(s.start.entrypoint, "main.R");
    assert_eq!(s.route.port, 8765);
    assert_eq!(s.route.host.to_string(), "127.0.0.1");
    assert_eq!(s.scale.replicas, 3);
    assert_eq!(s.scale.warm_replicas, 0);
    assert_eq!(s.route.lb_policy, LbPolicy::RoundRobin);
    assert_eq!(s.scale.drain_timeout_ms, 3_600_000);
    assert_eq!(s.scale.restart_policy, RestartPolicy::OnFailure);
    let env: Vec<(&str, &str)> = s.start.env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(env, vec![("DB_HOST", "db.local"), ("DEBUG", "true"), ("EMPTY", ""), ("VERSION", "1.10"), ("WORKERS", "4")]);
    assert_eq!(s.state_file, d.0.join("var/sales.json"));
    assert_eq!(s.scale.idle_timeout_ms, 0);
    assert_eq!(s.route.request_timeout_ms, 500);
    assert_eq!(s.start.r_path, d.0.join("bin/R").to_string_lossy());
}

#[test]
fn other_spellings_are_accepted() {
    let d = TestDir::new();
    let s = d
        .parse(
            "\"app-name\": hello\nport: 9000\nhost: '::'\nenv: {A: 1, B: x}\nidle-timeout: 90\n\
             drain-timeout: 30s\nlb-policy: first\nrestart-policy: never\nreplicas: \"2\"\n\
             working-dir: ",
        )
        .map(|_| ())
        .expect_err("empty working-dir");
    assert_eq!(s.key.as_deref(), Some("working-dir"));
    let wd = d.0.to_string_lossy().into_owned();
    let s = d
        .parse(&format!(
            "\"app-name\": hello\nport: 9000\nhost: '::'\nenv: {{A: 1, B: x}}\nidle-timeout: 90\n\
             drain-timeout: 30s\nlb-policy: first\nrestart-policy: never\nreplicas: \"2\"\n\
             working-dir: {wd}\nstate-file: {wd}/s.json\n"
        ))
        .unwrap();
    assert_eq!(s.route.host.to_string(), "::");
    assert_eq!(s.start.env.get("A").map(String::as_str), Some("1"));
    assert_eq!(s.scale.idle_timeout_ms, 90_000);
    assert_eq!(s.scale.drain_timeout_ms, 30_000);
    assert_eq!(s.route.lb_policy, LbPolicy::First);
    assert_eq!(s.scale.restart_policy, RestartPolicy::Never);
    assert_eq!(s.scale.replicas, 2);
    assert_eq!(s.start.working_dir, d.0);
    assert_eq!(s.state_file, d.0.join("s.json"));
    // An empty env is no env.
    assert!(d.parse("app-name: a\nport: 1\nenv:\n").unwrap().start.env.is_empty());
}

#[test]
fn unknown_key() {
    let d = TestDir::new();
    let msg = d.refused(
        "app-name: hello\nport: 8080\nreplica: 2\n",
        3,
        "replica",
        &["unknown key", "allowed keys", "app-name", "warm-replicas", "r-path", "did you mean replicas?"],
    );
    assert!(msg.contains("request-timeout"));
    d.refused("app-name: hello\nport: 8080\n\nworking_dir: .\n", 4, "working_dir", &["did you mean working-dir?"]);
    d.refused("name: hello\nport: 8080\n", 1, "name", &["did you mean app-name?"]);
}

#[test]
fn wrong_types() {
    let d = TestDir::new();
    d.refused("app-name: hello\nport: 8080\nreplicas: two\n", 3, "replicas", &["\"two\"", "whole number", "at least 1", "at most 1000"]);
    d.refused("app-name: hello\nport: \"abc\"\n", 2, "port", &["\"abc\"", "1-65535", "20000-29999"]);
    d.refused("app-name: hello\nport: 80.5\n", 2, "port", &["80.5", "1-65535"]);
    d.refused("app-name: hello\nport: 8080\nhost:\n  - a\n  - b\n", 3, "host", &["a list", "IP address"]);
    d.refused("app-name: [a]\nport: 8080\n", 1, "app-name", &["a list", "[a-z0-9][a-z0-9-]*"]);
    d.refused("app-name: hello\nport: 8080\nenv: [A, B]\n", 3, "env", &["a list", "mapping of variable names"]);
    d.refused("app-name: hello\nport: 8080\nwarm-replicas: -1\n", 3, "warm-replicas", &["-1", "0 or more"]);
    d.refused("app-name: hello\nport: 8080\nlb-policy: 3\n", 3, "lb-policy", &["least-conn, round-robin, random, first"]);
    d.refused("app-name: hello\nport: 8080\ndrain-timeout: true\n", 3, "drain-timeout", &["true", "500ms", "30s", "15m", "1h"]);
    d.refused("app-name: hello\nport: 8080\nr-path:\n", 3, "r-path", &["empty value", "R executable"]);
}

#[test]
fn env_entries() {
    let d = TestDir::new();
    let base = "app-name: hello\nport: 8080\nenv:\n  GOOD: 1\n";
    d.refused(&format!("{base}  BAD-NAME: x\n"), 5, "env.BAD-NAME", &["[A-Za-z_][A-Za-z0-9_]*"]);
    d.refused(&format!("{base}  # note\n  NESTED:\n    a: 1\n"), 6, "env.NESTED", &["a mapping", "text"]);
    d.refused(&format!("{base}  LIST: [1, 2]\n"), 5, "env.LIST", &["a list", "text"]);
    d.refused(&format!("{base}  NOTHING:\n"), 5, "env.NOTHING", &["no value", "\"\""]);
    d.refused(&format!("{base}  SHINYCTL_COPY: 3\n"), 5, "env.SHINYCTL_COPY", &["set by shinyctl"]);
    d.refused("app-name: hello\nport: 8080\nenv: {A: 1, 9X: 2}\n", 3, "env.9X", &["variable name"]);
}

#[test]
fn ports() {
    let d = TestDir::new();
    for (p, what) in [("20000", "20000-29999"), ("29999", "kept for the copies"), ("0", "not a port"), ("70000", "not a port")] {
        d.refused(&format!("app-name: hello\n\nport: {p}\n"), 3, "port", &[what, "1-65535", p]);
    }
    assert_eq!(d.parse("app-name: hello\nport: 19999\n").unwrap().route.port, 19999);
    assert_eq!(d.parse("app-name: hello\nport: 65535\n").unwrap().route.port, 65535);
    assert_eq!(d.parse("app-name: hello\nport: 30000\n").unwrap().route.port, 30000);
}

#[test]
fn replicas_zero() {
    let d = TestDir::new();
    d.refused("app-name: hello\nport: 8080\nreplicas: 0\n", 3, "replicas", &["0", "at least 1"]);
    d.refused("app-name: hello\nport: 8080\nreplicas: 5000\n", 3, "replicas", &["too many", "at most 1000"]);
    assert_eq!(d.parse("app-name: hello\nport: 8080\nwarm-replicas: 0\n").unwrap().scale.warm_replicas, 0);
}

#[test]
fn bad_durations() {
    let d = TestDir::new();
    for bad in ["15 minutes", "1.5s", "-1", "10d", "s", "1h30m", "1.5"] {
        d.refused(
            &format!("app-name: hello\nport: 8080\ndrain-timeout: {bad}\n"),
            3,
            "drain-timeout",
            &["500ms", "30s", "15m", "1h", "whole number of seconds"],
        );
    }
    d.refused("app-name: hello\nport: 8080\nidle-timeout: 9000h\n", 3, "idle-timeout", &["too long", "8760h"]);
}

#[test]
fn request_timeout_limits() {
    let d = TestDir::new();
    d.refused("app-name: hello\nport: 8080\nrequest-timeout: 45s\n", 3, "request-timeout", &["45s", "longer than 30s", "at most 30s"]);
    d.refused("app-name: hello\nport: 8080\nrequest-timeout: 31\n", 3, "request-timeout", &["at most 30s"]);
    d.refused("app-name: hello\nport: 8080\nrequest-timeout: 0\n", 3, "request-timeout", &["more than 0"]);
    assert_eq!(d.parse("app-name: hello\nport: 8080\nrequest-timeout: 30\n").unwrap().route.request_timeout_ms, 30_000);
}

#[test]
fn bad_policies() {
    let d = TestDir::new();
    d.refused("app-name: hello\nport: 8080\nlb-policy: fastest\n", 3, "lb-policy", &["\"fastest\"", LbPolicy::ALLOWED]);
    d.refused("app-name: hello\nport: 8080\nrestart-policy: sometimes\n", 3, "restart-policy", &["\"sometimes\"", RestartPolicy::ALLOWED]);
}

#[test]
fn bad_host() {
    let d = TestDir::new();
    d.refused("app-name: hello\nport: 8080\nhost: example.org\n", 3, "host", &["not an IP address", "0.0.0.0", "127.0.0.1", "localhost"]);
}

#[test]
fn host_localhost_is_127_0_0_1() {
    let d = TestDir::new();
    for written in ["localhost", "LocalHost", " localhost "] {
        let s = d.parse(&format!("app-name: hello\nport: 8080\nhost: '{written}'\n")).unwrap();
        assert_eq!(s.route.host.to_string(), "127.0.0.1", "host: {written:?}");
    }
}

#[test]
fn missing_entrypoint_file() {
    let d = TestDir::new();
    let want = d.0.join("main.R").display().to_string();
    d.refused("app-name: hello\nport: 8080\nentrypoint-file: main.R\n", 3, "entrypoint-file", &["missing entrypoint file", &want]);
    fs::remove_file(d.0.join("app.R")).unwrap();
    let want = d.0.join("app.R").display().to_string();
    d.refused("app-name: hello\nport: 8080\n", 1, "entrypoint-file", &["missing entrypoint file", &want, "default app.R"]);
    d.refused(
        "app-name: hello\nport: 8080\nentrypoint-file: /etc/passwd\n",
        3,
        "entrypoint-file",
        &["absolute", "relative to working-dir"],
    );
}

#[test]
fn missing_or_bad_folders() {
    let d = TestDir::new();
    let want = d.0.join("nope").display().to_string();
    d.refused("app-name: hello\nport: 8080\nworking-dir: nope\n", 3, "working-dir", &[&want, "does not exist", "existing folder"]);
    d.refused("app-name: hello\nport: 8080\nworking-dir: app.R\n", 3, "working-dir", &["is not a folder"]);
    d.refused("app-name: hello\nport: 8080\nstate-file: nope/state.json\n", 3, "state-file", &[&want, "does not exist"]);
    d.refused("app-name: hello\nport: 8080\nstate-file: .\n", 3, "state-file", &["is a folder"]);
    d.refused("app-name: hello\nport: 8080\nr-path: ./nope/R\n", 3, "r-path", &["does not exist", "R executable"]);
}

#[test]
fn bad_app_names() {
    let d = TestDir::new();
    for bad in ["Hello", "hello_world", "-hello", "hé", "\"\""] {
        d.refused(&format!("port: 8080\napp-name: {bad}\n"), 2, "app-name", &["not a valid name", "[a-z0-9][a-z0-9-]*"]);
    }
    d.refused(&format!("port: 8080\napp-name: {}\n", "a".repeat(64)), 2, "app-name", &["at most 63"]);
    d.refused("app-name: ok\nport: 8080\napp-group: Team A\n", 3, "app-group", &["not a valid name"]);
    assert_eq!(d.parse("app-name: 2048\nport: 8080\n").unwrap().name, "2048");
}

#[test]
fn missing_required_keys() {
    let d = TestDir::new();
    d.refused("# hello\nport: 8080\n", 2, "app-name", &["missing", "required", "[a-z0-9][a-z0-9-]*"]);
    d.refused("app-name: hello\n", 1, "port", &["missing", "required", "1-65535"]);
}

#[test]
fn bad_documents() {
    let d = TestDir::new();
    let file = d.manifest().display().to_string();
    for (text, line, want) in [
        ("", 1, "empty"),
        ("# only a comment\n", 1, "empty"),
        ("- app-name: hello\n", 1, "not a list"),
        ("hello\n", 1, "mapping"),
        ("app-name: hello\nport: 8080\n  bad: indent\n", 3, "not valid YAML"),
        ("app-name: hello\nport: [8080\n", 3, "not valid YAML"),
        // saphyr stops at the plain scalar the tab continues.
        ("app-name: hello\n\tport: 8080\n", 1, "not tabs"),
        ("app-name: hello\nport: 8080\nenv:\n\tA: 1\n", 4, "tabs"),
        ("  app-name: hello\nport: 8080\n", 2, "not valid YAML"),
        ("app-name: hello\nport: 8080\nenv:\n  A: 1\n  A: 2\n", 5, "env.A: is given twice"),
        ("app-name: hello\nport: 8080\n\"port\": 1\n", 3, "port: is given twice"),
        ("app-name: a\nport: 1\n---\napp-name: b\nport: 2\n", 3, "one app a file"),
    ] {
        let e = d.parse(text).expect_err(text);
        let shown = e.to_string();
        assert!(shown.starts_with(&format!("{file}:{line}: ")), "{text:?}: {shown}");
        assert!(shown.contains(want), "{text:?}: {shown}");
    }
    d.refused("app-name: hello\nport: 8080\nport: 8081\n", 3, "port", &["twice"]);
    // Aliases that would expand past any manifest's size are refused.
    let mut bomb = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n".to_string();
    for i in 1..6 {
        bomb.push_str(&format!("a{i}: &a{i} [{}]\n", vec![format!("*a{}", i - 1); 10].join(", ")));
    }
    let e = d.parse(&bomb).unwrap_err();
    assert!(e.to_string().contains("aliases expand to too many values"), "{e}");
    assert_eq!(e.line, Some(4), "{e}");
    // A tab after `:` separates as a space does.
    assert_eq!(d.parse("app-name:\thello\nport:\t\t8080\n").unwrap().route.port, 8080);
    assert_eq!(d.parse("app-name: hello\nport: 8080\nenv: {A: \"x:\ty\"}\n").unwrap().start.env["A"], "x:\ty");
    let e = d.parse("app-name: hello\nport: 8080\n1: x\n").unwrap_err();
    assert_eq!(e.line, Some(3), "{e}");
    assert!(e.to_string().contains("allowed keys"), "{e}");
}

#[test]
fn relative_manifest_path_is_made_absolute() {
    let d = TestDir::new();
    let cwd = std::env::current_dir().unwrap();
    let rel = Path::new("some/where/hello.yaml");
    let e = parse(rel, MIN).unwrap_err();
    // The folder does not exist there, but the error names the absolute path.
    assert_eq!(e.file, cwd.join(rel));
    drop(d);
}

#[test]
fn durations() {
    assert_eq!(parse_duration("500ms"), Some(500));
    assert_eq!(parse_duration("30s"), Some(30_000));
    assert_eq!(parse_duration("15m"), Some(900_000));
    assert_eq!(parse_duration("1h"), Some(3_600_000));
    assert_eq!(parse_duration("0"), Some(0));
    assert_eq!(parse_duration("45"), Some(45_000));
    assert_eq!(parse_duration(" 2s "), Some(2000));
    for bad in ["", "ms", "1.5s", "-1", "+1", "1 s", "1d", "1h30m", "99999999999999999999", "18446744073709551615h"] {
        assert_eq!(parse_duration(bad), None, "{bad:?}");
    }
}

#[test]
fn key_lines_come_from_the_parser() {
    let d = TestDir::new();
    let text = "# c\n\"app-name\": hello\nenv: {V: 1.10, T: True}\n\nport:\n  8080\n";
    let (spec, lines) = parse_with_lines(&d.manifest(), text).unwrap();
    assert_eq!(lines.line("app-name"), Some(2));
    assert_eq!(lines.line("env"), Some(3));
    assert_eq!(lines.line("port"), Some(5));
    assert_eq!(lines.line("host"), None);
    assert_eq!(lines.line("V"), None, "only top-level keys");
    // A number or true/false in env is kept as written.
    assert_eq!(spec.start.env["V"], "1.10");
    assert_eq!(spec.start.env["T"], "True");
}

#[test]
fn connection_limits_and_trusted_proxies() {
    let d = TestDir::new();
    let s = d.parse("app-name: hello\nport: 8080\nmax-connections: 500\ntrusted-proxies:\n  - 127.0.0.1\n  - 10.1.2.3/8\n  - \"[2001:db8::1]\"\n  - 10.0.0.0/8\n").unwrap();
    assert_eq!(s.route.max_connections, 500);
    assert_eq!(
        s.route.trusted_proxies.iter().map(ToString::to_string).collect::<Vec<_>>(),
        vec!["127.0.0.1", "10.0.0.0/8", "2001:db8::1"],
        "plain forms, each once"
    );
    let one = d.parse("app-name: hello\nport: 8080\ntrusted-proxies: 192.0.2.0/24\n").unwrap();
    assert_eq!(one.route.trusted_proxies.iter().map(ToString::to_string).collect::<Vec<_>>(), vec!["192.0.2.0/24"]);
    assert!(d.parse("app-name: hello\nport: 8080\ntrusted-proxies: []\n").unwrap().route.trusted_proxies.is_empty());
    // Neither decides how a copy starts: a change restarts no copy.
    let mut changed = s.clone();
    changed.route.max_connections = 7;
    changed.route.trusted_proxies.clear();
    assert_eq!(changed.settings_hash(), s.settings_hash());
}

#[test]
fn bad_connection_limits_and_trusted_proxies() {
    let d = TestDir::new();
    d.refused("app-name: hello\nport: 8080\nmax-connections: 0\n", 3, "max-connections", &["would let no visitor in", "at least 1"]);
    d.refused("app-name: hello\nport: 8080\nmax-connections: 2000000\n", 3, "max-connections", &["too many", "at most 1000000"]);
    d.refused("app-name: hello\nport: 8080\nmax-connections: lots\n", 3, "max-connections", &["\"lots\"", "whole number"]);
    d.refused(
        "app-name: hello\nport: 8080\ntrusted-proxies:\n  - 10.0.0.1\n  - proxy.local\n",
        3,
        "trusted-proxies",
        &["\"proxy.local\" is not an IP address or CIDR range", "10.0.0.0/8"],
    );
    d.refused("app-name: hello\nport: 8080\ntrusted-proxies: 10.0.0.0/40\n", 3, "trusted-proxies", &["not an IP address or CIDR range"]);
    d.refused("app-name: hello\nport: 8080\ntrusted-proxies: {a: 1}\n", 3, "trusted-proxies", &["a mapping", "a list of IP addresses"]);
}

#[test]
fn the_entrypoint_is_the_folders_layout_when_not_given() {
    let d = TestDir::new();
    let spec = |d: &TestDir| d.parse("app-name: hello\nport: 8080\n").map(|s| s.start.entrypoint);
    assert_eq!(spec(&d).unwrap(), "app.R");
    fs::remove_file(d.0.join("app.R")).unwrap();
    fs::write(d.0.join("ui.R"), "fluidPage()\n").unwrap();
    fs::write(d.0.join("server.R"), "function(input, output) {}\n").unwrap();
    assert_eq!(spec(&d).unwrap(), "server.R", "ui.R + server.R");
    fs::remove_file(d.0.join("ui.R")).unwrap();
    fs::remove_file(d.0.join("server.R")).unwrap();
    fs::write(d.0.join("notes.Rmd"), "---\ntitle: notes\n---\nplain\n").unwrap();
    fs::write(d.0.join("report.Rmd"), "---\ntitle: r\nruntime: shiny\n---\n").unwrap();
    assert_eq!(spec(&d).unwrap(), "report.Rmd", "the one document with runtime: shiny");
    fs::write(d.0.join("other.Rmd"), "---\nruntime: shinyrmd\n---\n").unwrap();
    let e = d.refused("app-name: hello\nport: 8080\n", 1, "entrypoint-file", &["several R Markdown documents", "other.Rmd, report.Rmd"]);
    assert!(e.contains("ui.R with server.R"), "{e}");
}

#[test]
fn shiny_documents_are_told_by_their_front_matter() {
    use super::keys::is_shiny_document;
    assert!(is_shiny_document("---\ntitle: x\nruntime: shiny\n---\n# hi"));
    assert!(is_shiny_document("---\nruntime: 'shinyrmd'\n---\n"));
    assert!(!is_shiny_document("---\ntitle: x\n---\nruntime: shiny\n"), "only the front matter counts");
    assert!(!is_shiny_document("# no front matter\nruntime: shiny\n"));
}

#[test]
fn capacity_keys_and_their_defaults() {
    let d = TestDir::new();
    let plain = d.parse("app-name: hello\nport: 8080\nreplicas: 2\n").unwrap();
    assert_eq!(plain.scale.max_sessions, None, "no limit unless set");
    assert_eq!(plain.scale.max_replicas, 2, "default: replicas, no growth");
    assert_eq!(plain.scale.scale_at, 0.8);
    assert_eq!(plain.scale.scale_down_after_ms, 5 * 60 * 1000);
    let s = d
        .parse("app-name: hello\nport: 8080\nreplicas: 2\nmax-replicas: 6\nmax-sessions: 20\nscale-at: 0.5\nscale-down-after: 30s\n")
        .unwrap();
    assert_eq!((s.scale.max_sessions, s.scale.max_replicas, s.scale.scale_at, s.scale.scale_down_after_ms), (Some(20), 6, 0.5, 30_000));
    assert_eq!(d.parse("app-name: hello\nport: 8080\nscale-at: 75%\n").unwrap().scale.scale_at, 0.75);
    assert_eq!(d.parse("app-name: hello\nport: 8080\nscale-at: 1\n").unwrap().scale.scale_at, 1.0);
    // None decides how a copy starts: a change restarts no copy.
    assert_eq!(s.settings_hash(), plain.settings_hash());
    // An app recorded before these keys existed loads with their defaults.
    let mut old = serde_json::to_value(&plain).unwrap();
    for key in ["max_sessions", "max_replicas", "scale_at", "scale_down_after_ms"] {
        old.as_object_mut().unwrap().remove(key);
    }
    let loaded: AppSpec = serde_json::from_value(old).unwrap();
    assert_eq!((loaded.scale.max_sessions, loaded.scale.max_active(), loaded.scale.scale_at), (None, 2, 0.8));
}

#[test]
fn bad_capacity_keys() {
    let d = TestDir::new();
    d.refused("app-name: hello\nport: 8080\nmax-sessions: 0\n", 3, "max-sessions", &["would let no visitor in", "at least 1"]);
    d.refused("app-name: hello\nport: 8080\nmax-sessions: many\n", 3, "max-sessions", &["\"many\"", "whole number"]);
    d.refused("app-name: hello\nport: 8080\nmax-replicas: 0\n", 3, "max-replicas", &["serve nobody", "at least replicas"]);
    d.refused("app-name: hello\nport: 8080\nmax-replicas: 5000\n", 3, "max-replicas", &["too many"]);
    d.refused(
        "app-name: hello\nport: 8080\nmax-replicas: 2\nreplicas: 3\n",
        3,
        "max-replicas",
        &["2 is fewer than replicas (3)", "at least replicas (3)"],
    );
    d.refused("app-name: hello\nport: 8080\nscale-at: 0\n", 3, "scale-at", &["more than 0 and at most 1"]);
    d.refused("app-name: hello\nport: 8080\nscale-at: 1.5\n", 3, "scale-at", &["1.5 is not allowed", "at most 1"]);
    d.refused("app-name: hello\nport: 8080\nscale-at: 120%\n", 3, "scale-at", &["at most 1"]);
    d.refused("app-name: hello\nport: 8080\nscale-at: high\n", 3, "scale-at", &["\"high\"", "such as 0.8"]);
    d.refused("app-name: hello\nport: 8080\nscale-down-after: soon\n", 3, "scale-down-after", &["\"soon\"", "a duration"]);
}
