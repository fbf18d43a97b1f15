//! The manifest's unit tests for the fence's keys: `sandbox:` (each sub-key
//! and each refusal, named `sandbox.KEY` at its own line), `run-as`, sizes,
//! and what changes the settings hash.

use super::tests::TestDir;
use super::*;
use std::fs;

const MIN: &str = "app-name: hello\nport: 8080\n";

#[test]
fn the_fence_defaults() {
    let d = TestDir::new();
    let s = d.parse(MIN).unwrap();
    assert_eq!(s.start.sandbox, Sandbox::default());
    assert_eq!(s.start.sandbox.mode, SandboxMode::On);
    assert_eq!((s.start.sandbox.memory, s.start.sandbox.tasks, s.start.sandbox.open_files), (None, DEFAULT_TASKS, DEFAULT_OPEN_FILES));
    assert_eq!(s.start.sandbox.syscalls, Syscalls::Default);
    assert_eq!(s.start.run_as, None);
    assert_eq!(d.parse(&format!("{MIN}sandbox:\n")).unwrap().start.sandbox, Sandbox::default(), "an empty section is the defaults");
}

#[test]
fn every_sandbox_key_is_parsed() {
    let d = TestDir::new();
    fs::create_dir_all(d.0.join("data")).unwrap();
    let text = format!(
        "{MIN}sandbox:\n  mode: strict\n  memory: 1.5G\n  tasks: 100\n  open-files: 1024\n  \
         writable-paths:\n    - data\n    - /tmp\n  hidden-paths: [/etc/shadow, secrets]\n  syscalls: unconfined\nrun-as: nobody\n"
    );
    let s = d.parse(&text).unwrap();
    assert_eq!(s.start.sandbox.mode, SandboxMode::Strict);
    assert_eq!(s.start.sandbox.memory, Some(3 << 29));
    assert_eq!(s.start.sandbox.tasks, 100);
    assert_eq!(s.start.sandbox.open_files, 1024);
    assert_eq!(s.start.sandbox.writable_paths, vec![d.0.join("data"), PathBuf::from("/tmp")]);
    assert_eq!(s.start.sandbox.hidden_paths, vec![PathBuf::from("/etc/shadow"), d.0.join("secrets")]);
    assert_eq!(s.start.sandbox.syscalls, Syscalls::Unconfined);
    assert_eq!(s.start.run_as.as_deref(), Some("nobody"));
    let s = d.parse(&format!("{MIN}sandbox: {{mode: off, memory: 536870912}}\n")).unwrap();
    assert_eq!((s.start.sandbox.mode, s.start.sandbox.memory), (SandboxMode::Off, Some(512 << 20)));
    assert_eq!(d.parse(&format!("{MIN}sandbox:\n  mode: on\n")).unwrap().start.sandbox.mode, SandboxMode::On);
}

#[test]
fn bad_sandbox_values_are_refused_at_their_line() {
    let d = TestDir::new();
    let at = |sub: &str| format!("{MIN}# the fence\nsandbox:\n  # its limits\n{sub}");
    d.refused(&at("  mode: maybe\n"), 6, "sandbox.mode", &["\"maybe\"", "on", "off", "strict"]);
    d.refused(&at("  memory: lots\n"), 6, "sandbox.memory", &["\"lots\"", "512M", "2G", "at least 64M"]);
    d.refused(&at("  memory: 10M\n"), 6, "sandbox.memory", &["10M", "too little", "at least 64M"]);
    d.refused(&at("  memory: 1.5\n"), 6, "sandbox.memory", &["1.5", "whole number of bytes"]);
    d.refused(&at("  memory:\n"), 6, "sandbox.memory", &["empty value", "leave the key out"]);
    d.refused(&at("  tasks: 4\n"), 6, "sandbox.tasks", &["4 is too few", "32 to 4194304"]);
    d.refused(&at("  tasks: 9999999\n"), 6, "sandbox.tasks", &["more than the kernel allows"]);
    d.refused(&at("  tasks: many\n"), 6, "sandbox.tasks", &["\"many\"", "whole number"]);
    d.refused(&at("  open-files: 10\n"), 6, "sandbox.open-files", &["too few", "64 to 1048576"]);
    d.refused(&at("  open-files: 2000000\n"), 6, "sandbox.open-files", &["above the usual hard limit"]);
    d.refused(&at("  syscalls: none\n"), 6, "sandbox.syscalls", &["\"none\"", "default", "unconfined"]);
    d.refused(&at("  writable-paths: data\n"), 6, "sandbox.writable-paths", &["\"data\"", "a list of existing folders"]);
    d.refused(&at("  hidden-paths:\n    - [a]\n"), 6, "sandbox.hidden-paths", &["a list is not a path"]);
    d.refused(&at("  hidden-paths:\n    - /\n"), 7, "sandbox.hidden-paths", &["the whole disk"]);
    let want = d.0.join("nope").display().to_string();
    d.refused(&at("  writable-paths:\n    - /tmp\n    - nope\n"), 8, "sandbox.writable-paths", &[&want, "does not exist"]);
    d.refused(&format!("{MIN}sandbox: strict\n"), 3, "sandbox", &["\"strict\"", "a mapping with any of mode, memory"]);
    d.refused(&format!("{MIN}sandbox: {{memory: 1M}}\n"), 3, "sandbox.memory", &["too little"]);
}

#[test]
fn the_disk_is_a_size_or_unlimited_and_1g_by_default() {
    let d = TestDir::new();
    assert_eq!(d.parse(MIN).unwrap().start.sandbox.disk, sandbox::Disk::Size(1 << 30));
    for (v, want) in [("2G", Some(2u64 << 30)), ("512M", Some(512 << 20)), ("67108864", Some(64 << 20)), ("unlimited", None)] {
        assert_eq!(d.parse(&format!("{MIN}sandbox:\n  disk: {v}\n")).unwrap().start.sandbox.disk.bytes(), want, "{v}");
    }
    let at = |sub: &str| format!("{MIN}sandbox:\n{sub}");
    d.refused(&at("  disk: 1M\n"), 4, "sandbox.disk", &["1M is too little", "at least 16M", "unlimited"]);
    d.refused(&at("  disk: lots\n"), 4, "sandbox.disk", &["\"lots\"", "1G", "unlimited", "leave the key out for 1G"]);
    d.refused(&at("  disk: [1G]\n"), 4, "sandbox.disk", &["a list", "unlimited"]);
    d.refused(&at("  disk:\n"), 4, "sandbox.disk", &["empty value"]);
}

#[test]
fn the_disk_key_leaves_the_hash_of_apps_from_before_it_unchanged() {
    let d = TestDir::new();
    // What the settings' hash took of a non-default fence before the key:
    // the same bytes, so those apps keep their copies.
    let s = d.parse(&format!("{MIN}sandbox:\n  memory: 2G\n")).unwrap();
    let before =
        r#"{"mode":"on","memory":2147483648,"tasks":512,"open-files":4096,"writable-paths":[],"hidden-paths":[],"syscalls":"default"}"#;
    assert_eq!(serde_json::to_string(&s.start.sandbox).unwrap(), before);
    assert_eq!(d.parse(&format!("{MIN}sandbox:\n  disk: 1G\n")).unwrap().settings_hash(), d.parse(MIN).unwrap().settings_hash());
    let plain = d.parse(MIN).unwrap().settings_hash();
    let sized = d.parse(&format!("{MIN}sandbox:\n  disk: 2G\n")).unwrap().settings_hash();
    let unlimited = d.parse(&format!("{MIN}sandbox:\n  disk: unlimited\n")).unwrap().settings_hash();
    assert!(plain != sized && plain != unlimited && sized != unlimited, "a new size restarts the copies");
    // The launcher reads it back from the JSON it is given.
    let back: Sandbox = serde_json::from_str(
        &serde_json::to_string(&d.parse(&format!("{MIN}sandbox:\n  disk: unlimited\n")).unwrap().start.sandbox).unwrap(),
    )
    .unwrap();
    assert_eq!(back.disk, sandbox::Disk::Unlimited);
}

#[test]
fn unknown_sandbox_keys_get_a_suggestion() {
    let d = TestDir::new();
    d.refused(
        &format!("{MIN}sandbox:\n  memory: 2G\n  memroy: 2G\n"),
        5,
        "sandbox.memroy",
        &["unknown key", "mode, memory, tasks, open-files, disk, writable-paths, hidden-paths, syscalls", "did you mean memory?"],
    );
    d.refused(&format!("{MIN}sandbox:\n  open_files: 100\n"), 4, "sandbox.open_files", &["did you mean open-files?"]);
    d.refused(&format!("{MIN}sandbox:\n  paths: [a]\n"), 4, "sandbox.paths", &["unknown key"]);
    d.refused(&format!("{MIN}sandbox:\n  1: x\n"), 4, "sandbox", &["the number 1 is not a key"]);
    d.refused(&format!("{MIN}sandbx:\n  memory: 2G\n"), 3, "sandbx", &["did you mean sandbox?"]);
    d.refused(&format!("{MIN}run_as: nobody\n"), 3, "run_as", &["did you mean run-as?"]);
}

#[test]
fn run_as_names_a_user_of_this_machine() {
    let d = TestDir::new();
    assert_eq!(d.parse(&format!("{MIN}run-as: nobody\n")).unwrap().start.run_as.as_deref(), Some("nobody"));
    d.refused(&format!("{MIN}run-as: root\n"), 3, "run-as", &["root is uid 0", "leave run-as out"]);
    d.refused(&format!("{MIN}run-as: Not A User\n"), 3, "run-as", &["not a user name", "lowercase letters"]);
    d.refused(&format!("{MIN}run-as: no-such-user-here\n"), 3, "run-as", &["there is no user \"no-such-user-here\""]);
    d.refused(&format!("{MIN}run-as:\n"), 3, "run-as", &["empty value", "user on this machine"]);
    d.refused(&format!("{MIN}run-as: [a]\n"), 3, "run-as", &["a list"]);
}

#[test]
fn the_fence_changes_the_settings_hash_only_when_it_is_not_the_default() {
    let d = TestDir::new();
    let plain = d.parse(MIN).unwrap().settings_hash();
    assert_eq!(d.parse(&format!("{MIN}sandbox:\n  mode: on\n")).unwrap().settings_hash(), plain, "the defaults written out");
    let hashes: Vec<String> = ["sandbox:\n  memory: 2G\n", "sandbox:\n  memory: 1G\n", "sandbox:\n  mode: off\n", "run-as: nobody\n"]
        .iter()
        .map(|extra| d.parse(&format!("{MIN}{extra}")).unwrap().settings_hash())
        .collect();
    for (i, h) in hashes.iter().enumerate() {
        assert_ne!(h, &plain, "{i}");
        assert!(!hashes[..i].contains(h), "{i}");
    }
}

#[test]
fn sizes() {
    for (s, want) in [
        ("512M", 512 << 20),
        ("2G", 2 << 30),
        ("1.5G", 3 << 29),
        ("100", 100),
        ("64Mi", 64 << 20),
        ("64MiB", 64 << 20),
        ("64mb", 64 << 20),
        (" 1 T ", 1 << 40),
        ("300K", 300 << 10),
    ] {
        assert_eq!(parse_size(s), Some(want), "{s:?}");
    }
    for bad in ["", "M", "1.5", "-1G", "1,5G", "2X", "1..5G", ".5G", "5.G", "99999999999T", "1G2"] {
        assert_eq!(parse_size(bad), None, "{bad:?}");
    }
}
