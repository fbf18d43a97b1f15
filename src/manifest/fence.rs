//! The fence's keys: the `sandbox:` section (a mapping whose sub-keys are
//! checked one by one and refused at their own line as `sandbox.KEY`) and
//! `run-as`.

use std::path::PathBuf;

use super::error::{describe, shown_scalar, KeyContext};
use super::keys::resolve;
use super::sandbox::{parse_size, Disk, MAX_OPEN_FILES, MAX_TASKS, MIN_DISK, MIN_MEMORY, MIN_OPEN_FILES, MIN_TASKS};
use super::yaml::Value;
use super::{ManifestError, Sandbox, SandboxMode, Syscalls};

/// The sub-keys of `sandbox:`, in the order the documentation lists them.
pub const SANDBOX_KEYS: [&str; 8] = ["mode", "memory", "tasks", "open-files", "disk", "writable-paths", "hidden-paths", "syscalls"];

const SANDBOX_ALLOWED: &str = "a mapping with any of mode, memory, tasks, open-files, disk, writable-paths, hidden-paths, syscalls, \
     one `key: value` a line, indented under sandbox";
const MODE_ALLOWED: &str = "one of on (the default: every fence the machine allows), off (no fence), \
     strict (the whole fence or no start)";
const SYSCALLS_ALLOWED: &str = "one of default (the filter), unconfined (no filter)";
const RUN_AS_ALLOWED: &str = "the name of a user on this machine (lowercase letters, digits, '_' and '-', \
     starting with a letter or '_', at most 32 characters)";

/// `sandbox`: a mapping; an empty `sandbox:` is the defaults.
pub(super) fn sandbox(cx: &KeyContext, v: &Value) -> Result<Sandbox, ManifestError> {
    let map = match v {
        Value::Null => return Ok(Sandbox::default()),
        Value::Mapping(m) => m,
        other => return Err(cx.wrong_type(other, SANDBOX_ALLOWED)),
    };
    let mut out = Sandbox::default();
    for (k, node) in map {
        let Value::String(sub) = &k.value else {
            return Err(cx.doc.at(k.line, Some(cx.key), format!("{} is not a key; allowed: {SANDBOX_ALLOWED}", describe(&k.value))));
        };
        let full = format!("{}.{sub}", cx.key);
        let sub_cx = cx.doc.nested(&full, k.line);
        let val = &node.value;
        match sub.as_str() {
            "mode" => out.mode = mode(&sub_cx, val)?,
            "memory" => out.memory = Some(memory(&sub_cx, val)?),
            "tasks" => out.tasks = tasks(&sub_cx, val)?,
            "open-files" => out.open_files = open_files(&sub_cx, val)?,
            "disk" => out.disk = disk(&sub_cx, val)?,
            "writable-paths" => out.writable_paths = paths(&sub_cx, val, true)?,
            "hidden-paths" => out.hidden_paths = paths(&sub_cx, val, false)?,
            "syscalls" => out.syscalls = syscalls(&sub_cx, val)?,
            _ => return Err(sub_cx.unknown(&SANDBOX_KEYS)),
        }
    }
    Ok(out)
}

/// `sandbox.mode`: on, off, strict (true/false taken as on/off).
fn mode(cx: &KeyContext, v: &Value) -> Result<SandboxMode, ManifestError> {
    match v {
        Value::Bool(true) => return Ok(SandboxMode::On),
        Value::Bool(false) => return Ok(SandboxMode::Off),
        _ => {}
    }
    let s = cx.string(v, MODE_ALLOWED)?;
    match s.trim() {
        "on" => Ok(SandboxMode::On),
        "off" => Ok(SandboxMode::Off),
        "strict" => Ok(SandboxMode::Strict),
        _ => Err(cx.err(format!("{s:?} is not a mode; allowed: {MODE_ALLOWED}"))),
    }
}

/// `sandbox.memory`: a size, at least [`MIN_MEMORY`].
fn memory(cx: &KeyContext, v: &Value) -> Result<u64, ManifestError> {
    let allowed = format!(
        "a size such as 512M, 2G or 1.5G (K, M, G, T: powers of 1024) or a whole number of bytes, at least {}; \
         leave the key out for no limit",
        crate::sys::fmt::size(MIN_MEMORY, crate::sys::fmt::SizeStyle::Manifest)
    );
    let bytes = match v {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => parse_size(s),
        _ => None,
    };
    let Some(bytes) = bytes else { return Err(cx.wrong_type(v, &allowed)) };
    if bytes < MIN_MEMORY {
        return Err(cx.err(format!("{} is too little for R to start; allowed: {allowed}", shown_scalar(v))));
    }
    Ok(bytes)
}

/// `sandbox.disk`: a size, at least [`MIN_DISK`], or `unlimited`.
fn disk(cx: &KeyContext, v: &Value) -> Result<Disk, ManifestError> {
    let allowed = format!(
        "a size such as 1G, 512M or 2.5G (K, M, G, T: powers of 1024) or a whole number of bytes, at least {}, \
         or unlimited; leave the key out for 1G",
        crate::sys::fmt::size(MIN_DISK, crate::sys::fmt::SizeStyle::Manifest)
    );
    let bytes = match v {
        Value::Number(n) => n.as_u64(),
        Value::String(s) if s.trim() == "unlimited" => return Ok(Disk::Unlimited),
        Value::String(s) => parse_size(s),
        _ => None,
    };
    let Some(bytes) = bytes else { return Err(cx.wrong_type(v, &allowed)) };
    if bytes < MIN_DISK {
        return Err(cx.err(format!("{} is too little for R's own temporary files; allowed: {allowed}", shown_scalar(v))));
    }
    Ok(Disk::Size(bytes))
}

/// `sandbox.tasks`: [`MIN_TASKS`] to [`MAX_TASKS`].
fn tasks(cx: &KeyContext, v: &Value) -> Result<u32, ManifestError> {
    let allowed = format!("a whole number of processes and threads, {MIN_TASKS} to {MAX_TASKS}");
    let n = cx.uint(v, &allowed)?;
    if !(MIN_TASKS as u64..=MAX_TASKS as u64).contains(&n) {
        let why = if n < MIN_TASKS as u64 { "too few for R and its threads" } else { "more than the kernel allows" };
        return Err(cx.err(format!("{n} is {why}; allowed: {allowed}")));
    }
    Ok(n as u32)
}

/// `sandbox.open-files`: [`MIN_OPEN_FILES`] to [`MAX_OPEN_FILES`].
fn open_files(cx: &KeyContext, v: &Value) -> Result<u64, ManifestError> {
    let allowed = format!("a whole number, {MIN_OPEN_FILES} to {MAX_OPEN_FILES} (the usual hard limit)");
    let n = cx.uint(v, &allowed)?;
    if n < MIN_OPEN_FILES {
        return Err(cx.err(format!("{n} is too few for R to start; allowed: {allowed}")));
    }
    if n > MAX_OPEN_FILES {
        return Err(cx.err(format!("{n} is above the usual hard limit; allowed: {allowed}")));
    }
    Ok(n)
}

/// `sandbox.syscalls`.
fn syscalls(cx: &KeyContext, v: &Value) -> Result<Syscalls, ManifestError> {
    let s = cx.string(v, SYSCALLS_ALLOWED)?;
    match s.trim() {
        "default" => Ok(Syscalls::Default),
        "unconfined" => Ok(Syscalls::Unconfined),
        _ => Err(cx.err(format!("{s:?} is not accepted; allowed: {SYSCALLS_ALLOWED}"))),
    }
}

/// `sandbox.writable-paths` (`must_exist`) and `sandbox.hidden-paths`: a
/// list of paths, absolute or relative to the manifest's folder; `/` is
/// refused (all or nothing of the disk is no fence). An empty key is none.
fn paths(cx: &KeyContext, v: &Value, must_exist: bool) -> Result<Vec<PathBuf>, ManifestError> {
    let what = if must_exist { "existing folders or files the copy may write" } else { "folders or files the copy must not see" };
    let allowed = format!("a list of {what}, absolute or relative to the manifest's folder, one `- path` a line");
    let items = match v {
        Value::Null => return Ok(Vec::new()),
        Value::Sequence(items) => items,
        other => return Err(cx.wrong_type(other, &allowed)),
    };
    let mut out = Vec::with_capacity(items.0.len());
    for item in &items.0 {
        // A path that cannot be is refused at its own line.
        let refuse = |message: String| ManifestError { line: Some(item.line), ..cx.err(message) };
        let s = match &item.value {
            Value::String(s) if !s.trim().is_empty() => s,
            other => return Err(cx.err(format!("{} is not a path; allowed: {allowed}", describe(other)))),
        };
        let p = resolve(cx.doc.dir, s);
        if p == std::path::Path::new("/") {
            return Err(refuse(format!("{s:?} is the whole disk; allowed: {allowed}")));
        }
        if must_exist && !p.exists() {
            return Err(refuse(format!("{} does not exist; allowed: {allowed}", p.display())));
        }
        out.push(p);
    }
    Ok(out)
}

/// `run-as`: a user name of the usual form that exists on this machine.
/// Whether the daemon may switch to it (it runs as root) is a matter for
/// when a copy starts.
pub(super) fn run_as(cx: &KeyContext, v: &Value) -> Result<String, ManifestError> {
    let s = cx.nonempty_string(v, RUN_AS_ALLOWED)?;
    let name = s.trim();
    if !valid_user_name(name) {
        return Err(cx.err(format!("{name:?} is not a user name; allowed: {RUN_AS_ALLOWED}")));
    }
    match nix::unistd::User::from_name(name) {
        Ok(Some(u)) if u.uid.is_root() => Err(cx.err(format!(
            "{name} is uid 0: a copy run as root would have every capability and read every file, which the fence exists to prevent; leave run-as out (each app then runs as a uid of its own) or name another user"
        ))),
        Ok(Some(_)) => Ok(name.to_string()),
        Ok(None) => Err(cx.err(format!("there is no user {name:?} on this machine; allowed: {RUN_AS_ALLOWED}"))),
        Err(e) => Err(cx.err(format!("the user {name:?} cannot be looked up: {e}; allowed: {RUN_AS_ALLOWED}"))),
    }
}

/// `[a-z_][a-z0-9_-]*`, at most 32 characters (useradd's rule, without the
/// trailing `$` of machine accounts).
fn valid_user_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 32
        && (b[0].is_ascii_lowercase() || b[0] == b'_')
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_' || *c == b'-')
}
