//! The manifest's messages over a large set of manifests, good and bad:
//! every key with good and bad values (in block and flow form), unknown and
//! misspelt keys, nested sandbox keys, env entries, and the document's own
//! faults (tabs, bad indentation, several documents, duplicates, anchors,
//! CRLF, …). `tests_corpus.txt` holds, for each manifest, the full message
//! the user sees (or `ok`); a change of parser or of a message shows as a
//! difference. `SHINYCTL_RECORD_CORPUS=1 cargo test --lib manifest::tests_corpus`
//! writes the file anew from the code as it is (then review its diff). The
//! table was first recorded with serde_yaml; git's history of the file
//! shows each message the move to saphyr changed.

use super::tests::TestDir;
use std::fmt::Write as _;
use std::fs;

/// Values tried for every top-level key and every sandbox key: the kinds of
/// YAML scalar and collection, and the shapes the keys accept.
const VALUES: &[&str] = &[
    "hello",
    "8080",
    "0",
    "-1",
    "1.5",
    "80.0",
    "true",
    "no",
    "",
    "~",
    "null",
    "[1, 2]",
    "[]",
    "{a: 1}",
    "{}",
    "\"quoted text\"",
    "''",
    "\"  \"",
    "99999999999999999999",
    "0x1F90",
    "0o17",
    "1e3",
    ".inf",
    "!!str 8080",
    "30s",
    "500ms",
    "15m",
    "1h",
    "9000h",
    "45s",
    "0.8",
    "80%",
    "127.0.0.1",
    "localhost",
    "::1",
    "10.0.0.0/8",
    "10.0.0.0/40",
    "least-conn",
    "on-failure",
    "on",
    "strict",
    "unconfined",
    "512M",
    "1.5G",
    "100K",
    "4096",
    "2000000",
    "root",
    "no-such-user-here",
    "./www",
    "data.txt",
    "/",
    "nope/x",
    "app.R",
    "/bin/sh",
    "a # comment",
    "'it''s'",
    "\"tab\\there\"",
    "Team A",
    "&a 5",
    "|\n  block text",
    ">-\n  folded\n  text",
    "\n  - a\n  - b",
    "\n  - ./www\n  - data.txt",
    "\n  - /\n",
    "\n  k: v",
    "[./www, /]",
    "[127.0.0.1, \"2001:db8::/32\"]",
    "[ok, 10.0.0.0/99]",
];

/// Keys that are not a manifest's: misspellings, other cases, near names.
const UNKNOWN: &[&str] = &[
    "name",
    "App-Name",
    "app_name",
    "working_dir",
    "replica",
    "portt",
    "sandbx",
    "lb policy",
    "group",
    "timeout",
    "\"quoted-key\"",
    "? complex",
    "1234",
    "true",
    "[a, b]",
    "~",
];

/// Manifests written by hand: the document's own faults and its shapes.
const WHOLE: &[&str] = &[
    "",
    "\n\n",
    "# only a comment\n",
    "---\n",
    "---\n...\n",
    "hello\n",
    "42\n",
    "- app-name: hello\n- port: 8080\n",
    "[app-name, port]\n",
    "\"just text\"\n",
    "~\n",
    "app-name: hello\nport: 8080\n",
    "app-name: hello\r\nport: 8080\r\n",
    "app-name: hello\r\nport: 8080\r\nreplicas: x\r\n",
    "\u{feff}app-name: hello\nport: 8080\n",
    "\u{feff}app-name: hello\nport: 8080\nreplicas: 0\n",
    "{app-name: hello, port: 8080}\n",
    "{app-name: hello, port: 8080, replicas: 0}\n",
    "{app-name: hello,\n port: 8080,\n replicas: zero}\n",
    "{\"app-name\": hello, 'port': 8080, \"replicas\": 0}\n",
    "\"app-name\": hello\n'port': 8080\n'replicas': -3\n",
    "app-name: hello\nport: 8080\n---\napp-name: other\nport: 8081\n",
    "---\napp-name: hello\nport: 8080\n---\napp-name: other\n",
    "# c\n---\napp-name: hello\nport: 8080\n...\n---\nport: 1\n",
    "%YAML 1.2\n---\napp-name: hello\nport: 8080\n",
    "%YAML 1.2\n---\napp-name: hello\nport: 8080\nreplicas: 0\n",
    "app-name: hello\nport: 8080\nport: 8081\n",
    "app-name: hello\nport: 8080\n\n# again\napp-name: other\n",
    "app-name: hello\nport: 8080\nenv:\n  A: 1\n  A: 2\n",
    "app-name: hello\nport: 8080\nsandbox:\n  mode: on\n  mode: off\n",
    "{app-name: hello, port: 8080, port: 9090}\n",
    "app-name: hello\nport: 8080\n\"port\": 9090\n",
    "app-name: hello\n\tport: 8080\n",
    "app-name: hello\nport:\t8080\n",
    "app-name:\thello\nport: 8080\n",
    "\tapp-name: hello\nport: 8080\n",
    "app-name: hello\nport: 8080\nenv:\n\tA: 1\n",
    "app-name: hello\n  port: 8080\n",
    "  app-name: hello\nport: 8080\n",
    "app-name: hello\nport: 8080\nenv:\n  A: 1\n   B: 2\n",
    "app-name: hello\nport: 8080\nenv:\n    A: 1\n  B: 2\n",
    "app-name: hello\nport: 8080\nsandbox:\nmode: off\n",
    "app-name: hello\nport 8080\n",
    "app-name: hello\nport: 8080\nreplicas: [1, 2\n",
    "app-name: hello\nport: 8080\nenv: {A: 1\n",
    "app-name: hello\nport: 8080\nhost: \"127.0.0.1\n",
    "app-name: hello\nport: 8080\nhost: '127.0.0.1\n",
    "app-name: hello\nport: 8080\nhost: 127.0.0.1\"\n",
    "app-name: hello\nport: : 8080\n",
    "app-name: hello: world\nport: 8080\n",
    "app-name: hello\nport: 8080\n- item\n",
    "app-name: hello\nport: 8080\nreplicas: *nothing\n",
    "app-name: &n hello\nport: 8080\napp-group: *n\n",
    "base: &b\n  A: 1\napp-name: hello\nport: 8080\n",
    "app-name: hello\nport: &p 8080\nmax-connections: *p\n",
    "app-name: hello\nport: 8080\nenv: &e {A: 1}\nsandbox: *e\n",
    "app-name: hello\nport: 8080\nenv:\n  <<: {A: 1}\n",
    "app-name: hello\nport: 8080\n<<: {replicas: 2}\n",
    "app-name: !!str hello\nport: !!int 8080\n",
    "app-name: hello\nport: !!str 8080\n",
    "app-name: hello\nport: !custom 8080\n",
    "app-name: hello\nport: !!float 8080\n",
    "app-name: hello\nport: 8080\nenv: !!map {A: 1}\n",
    "app-name: hello\nport: 8080\nreplicas: !!binary aGVsbG8=\n",
    "app-name: hello # the name\nport: 8080 # the port\n# end\n",
    "app-name: hello\nport: 8080\nreplicas: 2 # two\nwarm-replicas: '#1'\n",
    "app-name: hello\nport: 8080\nhost: 127.0.0.1#x\n",
    "app-name: >\n  hello\nport: 8080\n",
    "app-name: |\n  hello\nport: 8080\n",
    "app-name: |-\n  hello\nport: 8080\n",
    "app-name:\n  hello\nport: 8080\n",
    "app-name: hello\nport:\n  8080\n",
    "app-name: hello\nport: 8080\nreplicas:\n\n\n  0\n",
    "app-name: \"hel\\\nlo\"\nport: 8080\n",
    "app-name: hello\nport: 8080\nenv:\n  A: \"line\\nbreak\"\n  B: 'x'\n  C: 1.10\n  D: 0x10\n  E: yes\n  F: true\n  G: 1e3\n  H: .inf\n  I: -0\n  J: 007\n",
    "app-name: hello\nport: 8080\nenv:\n  A: \"\\0\"\n",
    "app-name: hello\nport: 8080\nenv:\n  SHINYCTL_SCRATCH: x\n",
    "app-name: hello\nport: 8080\nenv:\n  1: one\n",
    "app-name: hello\nport: 8080\nenv:\n  true: one\n",
    "app-name: hello\nport: 8080\nenv:\n  [a]: one\n",
    "app-name: hello\nport: 8080\nenv:\n  ? {a: 1}\n  : one\n",
    "app-name: hello\nport: 8080\nenv:\n  A: ~\n",
    "app-name: hello\nport: 8080\nenv:\n  A: []\n",
    "app-name: hello\nport: 8080\nenv:\n  A: {}\n",
    "app-name: hello\nport: 8080\nenv:\n  A: ok\n  B:\n    - x\n",
    "app-name: hello\nport: 8080\nenv:\n  A: ok\n  # x\n\n  B-C: 1\n",
    "app-name: hello\nport: 8080\nenv: {A: 1, B: [2]}\n",
    "app-name: hello\nport: 8080\nenv: {A: 1,\n  B: {c: 2}}\n",
    "app-name: hello\nport: 8080\nenv:\n  \"QUOTED\": 1\n  'B C': 2\n",
    "app-name: hello\nport: 8080\nenv:\n  A: 1\nAPP: 2\n",
    "app-name: hello\nport: 8080\nenv:\n  PORT: 8080\n  ON: on\n  RATIO: 1.50\n  BIG: 99999999999999999999\n",
    "app-name: hello\nport: 8080\nenv:\n  RATIO: 1.50 # kept as written\n  HEX: 0xFF\n  OCT: 0o17\n  EXP: 1E3\n",
    "app-name: hello\nport: 8080\nenv: {RATIO: 1.50, T: True, N: -5}\n",
    "app-name: hello\nport: 8080\nsandbox:\n  memory: 512M\n  tasks: 5\n",
    "app-name: hello\nport: 8080\nsandbox:\n  memory: 512M\n  # tasks\n\n  tasks: nope\n",
    "app-name: hello\nport: 8080\nsandbox: {memory: 1G, tasks: 1}\n",
    "app-name: hello\nport: 8080\nsandbox: {memory: 1G,\n  tasks: 1}\n",
    "app-name: hello\nport: 8080\nsandbox:\n  1: x\n",
    "app-name: hello\nport: 8080\nsandbox:\n  [a]: x\n",
    "app-name: hello\nport: 8080\nsandbox:\n  writable-paths:\n    - ./www\n    - ./nope\n",
    "app-name: hello\nport: 8080\nsandbox:\n  writable-paths:\n    - ./www\n    - /\n",
    "app-name: hello\nport: 8080\nsandbox:\n  hidden-paths:\n    - /etc\n    - \"/\"\n",
    "app-name: hello\nport: 8080\nsandbox:\n  hidden-paths:\n    - /etc\n    - 5\n",
    "app-name: hello\nport: 8080\nsandbox:\n  hidden-paths:\n    - /etc\n    -\n",
    "app-name: hello\nport: 8080\nsandbox:\n  writable-paths: [./www, ./nope]\n",
    "app-name: hello\nport: 8080\nsandbox:\n  writable-paths:\n  - ./www\n  - nope\n",
    "app-name: hello\nport: 8080\nsandbox:\n  mode: off\n  nested:\n    deeper: 1\n",
    "app-name: hello\nport: 8080\nsandbox:\n  memory:\n    limit: 1G\n",
    "app-name: hello\nport: 8080\nsandbox:\n  Memory: 1G\n",
    "app-name: hello\nport: 8080\nsandbox:\n  open_files: 100\n",
    "app-name: hello\nport: 8080\nsandbox:\n  writable: [./www]\n",
    "app-name: hello\nport: 8080\nsandbox:\n  mode: off\nmode: on\n",
    "app-name: hello\nport: 8080\nmemory: 1G\n",
    "app-name: hello\nport: 8080\nsandbox:\n  sandbox:\n    mode: on\n",
    "app-name: hello\nport: 8080\ntrusted-proxies:\n  - 127.0.0.1\n  - nope\n",
    "app-name: hello\nport: 8080\ntrusted-proxies:\n  - 127.0.0.1\n  - [a]\n",
    "app-name: hello\nport: 8080\nreplicas: 3\nmax-replicas: 2\n",
    "app-name: hello\nport: 8080\nmax-replicas: 2\nreplicas: 3\n",
    "app-name: hello\nport: 8080\nentrypoint-file: main.R\n",
    "app-name: hello\nport: 8080\nworking-dir: www\n",
    "app-name: hello\nport: 8080\nworking-dir: www\nentrypoint-file: app.R\n",
    "port: 8080\n",
    "# c\n\nport: 8080\nreplicas: 2\n",
    "app-name: hello\n",
    "app-name: hello\nport: 20000\n",
    "app-name: hello\nport: 8080\nreplicas: 0\nport: 8081\n",
    "app-name: hello\nport: 8080\nbogus: 1\nreplicas: 0\n",
    "port: 8080\nenv: {A: 1}\napp-name: Hello\n",
    "app-name: hello\nport: 8080\nenv:\n  A: 1\n  B: \n  C: 3\n",
    "app-name: hello\nport: 8080\nenvx:\n  A: 1\n",
    "app-name: hello\nport: 8080\n  # indented comment\nreplicas: 0\n",
    "app-name: hello\nport: 8080\n? replicas\n: 0\n",
    "app-name: hello\nport: 8080\n? [a, b]\n: 0\n",
    "app-name: hello\nport: 8080\n? {a: 1}\n: 0\n",
    "app-name: hello\nport: 8080\nreplicas:0\n",
    "app-name: hello\nport: 8080\nreplicas : 0\n",
    "app-name: hello\nport: 8080\n  replicas: 0\n",
    "app-name: hello\nport: 8080\nreplicas: 1\nreplicas: 2\nreplicas: 3\n",
    "app-name: hello\nport: 8080\nreplicas: 1\n\"replicas\": 2\n",
    "app-name: hello\nport: 8080\nreplicas: 1\nreplicas : 2\n",
    "app-name: hello\nport: 8080\nhost: \"\"\n",
    "app-name: hello\nport: 8080\nhost: [127.0.0.1]\n",
    "app-name: hello\nport: 8080\nstate-file: ./www\n",
    "app-name: hello\nport: 8080\nstate-file: ./www/state.json\n",
    "app-name: hello\nport: 8080\nr-path: ./www\n",
    "app-name: hello\nport: 8080\nr-path: ./data.txt\n",
    "app-name: hello\nport: 8080\nreplicas: 1_000\n",
    "app-name: hello\nport: 8080\nreplicas: +2\n",
    "app-name: hello\nport: 8080\nreplicas: 2.0\n",
    "app-name: hello\nport: 8080\nreplicas: 0b11\n",
    "app-name: hello\nport: 8080\nreplicas: 010\n",
    "app-name: hello\nport: 8080\nreplicas: \" 2 \"\n",
    "app-name: hello\nport: 8080\nscale-at: .5\n",
    "app-name: hello\nport: 8080\nscale-at: 1\n",
    "app-name: hello\nport: 8080\nscale-at: 1.0001\n",
    "app-name: hello\nport: 8080\nscale-at: -.5\n",
    "app-name: hello\nport: 8080\nscale-at: .nan\n",
    "app-name: hello\nport: 8080\nscale-at: 1e-1\n",
    "app-name: hello\nport: 8080\nscale-at: \"50 %\"\n",
    "app-name: hello\nport: 8080\napp-group: 2024\n",
    "app-name: 2024\nport: 8080\n",
    "app-name: 1.5\nport: 8080\n",
    "app-name: -1\nport: 8080\n",
    "app-name: hello\nport: 8080\ndrain-timeout: 1.5\n",
    "app-name: hello\nport: 8080\nidle-timeout: -5\n",
    "app-name: hello\nport: 8080\nstart-timeout: 0s\n",
    "app-name: hello\nport: 8080\nkeep-releases: 101\n",
    "app-name: hello\nport: 8080\n\n\n\n\n\n\n\n\nreplicas: 0\n",
    "\n\n\napp-name: hello\n\n\nport: 8080\n\n\n\nsandbox:\n\n\n  tasks: 0\n",
    "app-name: hello\nport: 8080\nenv:\n\n  # blank and comment first\n\n  BAD NAME: 1\n",
    "app-name: hello\nport: 8080\nenv:\n  A: 1\n\n\n  9: x\n",
    "app-name: hello\nport: 8080\nreplicas: 2\nenv:\n  replicas: 0\n  port: x\n",
    "app-name: hello\nport: 8080\nsandbox:\n  mode: off\nenv:\n  mode: 1\n  tasks: x\n",
    "app-name: hello\nport: 8080\nenv:\n  A: |\n    many\n    lines\n  B: [x]\n",
    "app-name: hello\nport: 8080\nsandbox:\n  hidden-paths: |\n    /etc\n  tasks: 0\n",
    "app-name: hello\nport: 8080\nsandbox: &s\n  tasks: 0\n",
    "app-name: hello\nport: 8080\nsandbox:\n  tasks: &t 0\n",
    "app-name: hello\nport: 8080\nx: &t 0\nsandbox:\n  tasks: *t\n",
    "app-name: hello\nport: 8080\nx: &t 7\nreplicas: *t\nwarm-replicas: *t\nmax-replicas: 5\n",
    "app-name: hello\nport: 8080\nenv:\n  A: 1\n  A: 1\n",
    "app-name: hello\nport: 8080\nsandbox:\n  mode: on\n  tasks: 5\n  mode: on\n",
    "app-name: hello\nport: 8080\nenv: {A: 1, A: 2}\n",
    "app-name: hello\nport: 8080\nenv:\n  A: 1\nenv:\n  B: 2\n",
];

/// Every manifest of the set, in a fixed order.
fn corpus() -> Vec<String> {
    let base = "app-name: hello\nport: 8080\n# before the key\n";
    let mut out: Vec<String> = WHOLE.iter().map(|s| s.to_string()).collect();
    for key in super::KEYS {
        for v in VALUES {
            let text = match key {
                "app-name" => format!("# the name\napp-name: {v}\nport: 8080\n"),
                "port" => format!("app-name: hello\n\nport: {v}\n"),
                _ => format!("{base}{key}: {v}\n"),
            };
            out.push(text);
        }
        if !v_is_flow_unsafe(key) {
            out.push(format!("{{app-name: hello, port: 8080, {key}: 0}}\n"));
            out.push(format!("{{app-name: hello, port: 8080, {key}: [x]}}\n"));
        }
        out.push(format!("{base}\"{key}\": -1\n"));
        out.push(format!("{base}'{key}': {{}}\n"));
    }
    for key in super::SANDBOX_KEYS {
        for v in VALUES {
            out.push(format!("{base}sandbox:\n  # the fence\n  mode: on\n  {key}: {}\n", v.replace('\n', "\n  ")));
        }
        out.push(format!("{base}sandbox: {{mode: on, {key}: -1}}\n"));
    }
    for v in VALUES {
        out.push(format!("{base}env:\n  OK: fine\n  NAME: {}\n", v.replace('\n', "\n  ")));
    }
    for key in UNKNOWN {
        out.push(format!("{base}{key}: 1\n"));
        out.push(format!("{base}sandbox:\n  {key}: 1\n"));
    }
    out
}

/// Keys a flow mapping does not try (none today: every key takes `0`
/// and `[x]` in flow form).
fn v_is_flow_unsafe(_key: &str) -> bool {
    false
}

/// What the user sees for `text`: the message with the test's folder
/// written as `<dir>`, or `ok`.
fn shown(d: &TestDir, text: &str) -> String {
    match d.parse(text) {
        Ok(_) => "ok".to_string(),
        Err(e) => e.to_string().replace(&d.0.display().to_string(), "<dir>"),
    }
}

/// The whole table: each manifest (as a Rust string) and its message.
fn table() -> String {
    let d = TestDir::new();
    fs::create_dir_all(d.0.join("www")).unwrap();
    fs::write(d.0.join("www/app.R"), "library(shiny)\n").unwrap();
    fs::write(d.0.join("data.txt"), "x\n").unwrap();
    let mut out = String::new();
    for (i, text) in corpus().iter().enumerate() {
        writeln!(out, "#{i} {text:?}\n=> {}", shown(&d, text)).unwrap();
    }
    out
}

#[test]
fn every_message_is_as_recorded() {
    let got = table();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/manifest/tests_corpus.txt");
    if std::env::var_os("SHINYCTL_RECORD_CORPUS").is_some() {
        fs::write(&path, &got).unwrap();
        return;
    }
    let want = include_str!("tests_corpus.txt");
    let differ: Vec<String> = got.lines().zip(want.lines()).filter(|(g, w)| g != w).map(|(g, w)| format!("got:  {g}\nwant: {w}")).collect();
    assert!(
        differ.is_empty() && got.lines().count() == want.lines().count(),
        "{} lines differ from tests_corpus.txt (and {} against {} lines); first:\n{}",
        differ.len(),
        got.lines().count(),
        want.lines().count(),
        differ.iter().take(5).cloned().collect::<Vec<_>>().join("\n")
    );
}
