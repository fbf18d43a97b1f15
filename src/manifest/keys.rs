//! One check per key: each takes the key's YAML value and gives the value
//! the spec holds, or an error that names the key, its line and what is
//! allowed. `draft::TAKE` says which check takes which key; `env`, with its
//! entries, has a file of its own (`env.rs`); the checks that need several
//! keys are at the end.

use super::yaml::Value;
use std::path::{Component, Path, PathBuf};

use super::error::{shown_scalar, KeyContext};
use super::net::Cidr;
use super::{
    LbPolicy, ManifestError, RestartPolicy, MAX_CONNECTIONS, MAX_COPIES, MAX_LONG_DURATION_MS, MAX_NAME_LEN, MAX_REQUEST_TIMEOUT_MS,
    MAX_SESSIONS,
};

/// What `app-name` and `app-group` allow.
pub(super) const NAME_ALLOWED: &str = "lowercase letters, digits and '-', starting with a letter or a digit \
     ([a-z0-9][a-z0-9-]*), at most 63 characters";
/// What `port` allows.
pub(super) const PORT_ALLOWED: &str = "a whole number 1-65535, outside 20000-29999";
const DURATION_ALLOWED: &str = "a duration such as 500ms, 30s, 15m or 1h, or a whole number of seconds";
const HOST_ALLOWED: &str = "an IP address to listen on, such as 0.0.0.0 (every IPv4 address), \
     127.0.0.1 (this machine only; localhost says the same) or :: (every address)";

/// `app-name`.
pub(super) fn app_name(cx: &KeyContext, v: &Value) -> Result<String, ManifestError> {
    name(cx, v)
}

/// `app-group`.
pub(super) fn app_group(cx: &KeyContext, v: &Value) -> Result<String, ManifestError> {
    name(cx, v)
}

/// `working-dir`: an existing folder.
pub(super) fn working_dir(cx: &KeyContext, v: &Value) -> Result<PathBuf, ManifestError> {
    let s = cx.nonempty_string(v, "an existing folder, absolute or relative to the manifest's folder")?;
    let p = resolve(cx.doc.dir, &s);
    check_dir(cx, &p)?;
    Ok(p)
}

/// `entrypoint-file`: a relative path (that it exists is checked once
/// working-dir is known, by [`entrypoint_exists`]).
pub(super) fn entrypoint_file(cx: &KeyContext, v: &Value) -> Result<String, ManifestError> {
    let allowed = "a file in working-dir, such as app.R";
    let s = cx.nonempty_string(v, allowed)?;
    let p = Path::new(s.trim());
    if p.is_absolute() {
        return Err(cx.err(format!("{s:?} is an absolute path; allowed: {allowed} (a path relative to working-dir)")));
    }
    let rel: PathBuf = p.components().filter(|c| !matches!(c, Component::CurDir)).collect();
    if rel.as_os_str().is_empty() {
        return Err(cx.err(format!("{s:?} names no file; allowed: {allowed}")));
    }
    Ok(rel.to_string_lossy().into_owned())
}

/// `port`: outside the copies' own range.
pub(super) fn port(cx: &KeyContext, v: &Value) -> Result<u16, ManifestError> {
    let n = cx.uint(v, PORT_ALLOWED)?;
    if n == 0 || n > 65535 {
        return Err(cx.err(format!("{n} is not a port number; allowed: {PORT_ALLOWED}")));
    }
    if (20000..=29999).contains(&n) {
        return Err(cx.err(format!("{n} is in 20000-29999, which is kept for the copies' own ports; allowed: {PORT_ALLOWED}")));
    }
    Ok(n as u16)
}

/// `host`: an IP address, brackets around an IPv6 one allowed, or
/// `localhost`, which is 127.0.0.1.
pub(super) fn host(cx: &KeyContext, v: &Value) -> Result<std::net::IpAddr, ManifestError> {
    let s = cx.nonempty_string(v, HOST_ALLOWED)?;
    let t = s.trim();
    if t.eq_ignore_ascii_case("localhost") {
        return Ok(std::net::Ipv4Addr::LOCALHOST.into());
    }
    let t = t.strip_prefix('[').and_then(|x| x.strip_suffix(']')).unwrap_or(t);
    match t.parse::<std::net::IpAddr>() {
        Ok(ip) => Ok(ip),
        Err(_) => Err(cx.err(format!("{s:?} is not an IP address; allowed: {HOST_ALLOWED}"))),
    }
}

/// `replicas`: 1 to [`MAX_COPIES`].
pub(super) fn replicas(cx: &KeyContext, v: &Value) -> Result<u32, ManifestError> {
    let allowed = format!("a whole number, at least 1 (and at most {MAX_COPIES})");
    whole_in(cx, v, &allowed, 1..=MAX_COPIES, "copies would serve nobody")
}

/// A whole number in `range`; `few` says why one below it cannot be.
fn whole_in(cx: &KeyContext, v: &Value, allowed: &str, range: std::ops::RangeInclusive<u64>, few: &str) -> Result<u32, ManifestError> {
    let n = cx.uint(v, allowed)?;
    if n < *range.start() {
        return Err(cx.err(format!("{n} {few}; allowed: {allowed}")));
    }
    if n > *range.end() {
        return Err(cx.err(format!("{n} is too many; allowed: {allowed}")));
    }
    Ok(n as u32)
}

/// `warm-replicas`: 0 to [`MAX_COPIES`].
pub(super) fn warm_replicas(cx: &KeyContext, v: &Value) -> Result<u32, ManifestError> {
    let allowed = format!("a whole number, 0 or more (and at most {MAX_COPIES})");
    whole_in(cx, v, &allowed, 0..=MAX_COPIES, "")
}

/// `max-replicas`: 1 to [`MAX_COPIES`] (that it is at least `replicas` is
/// checked once both are read, by [`max_replicas_over_replicas`]).
pub(super) fn max_replicas(cx: &KeyContext, v: &Value) -> Result<u32, ManifestError> {
    let allowed = format!("a whole number, at least replicas (and at most {MAX_COPIES})");
    whole_in(cx, v, &allowed, 1..=MAX_COPIES, "copies would serve nobody")
}

/// `max-sessions`: 1 to [`MAX_SESSIONS`].
pub(super) fn max_sessions(cx: &KeyContext, v: &Value) -> Result<u32, ManifestError> {
    let allowed = format!("a whole number of Shiny sessions a copy takes before it is full, at least 1 (and at most {MAX_SESSIONS})");
    whole_in(cx, v, &allowed, 1..=MAX_SESSIONS, "sessions would let no visitor in")
}

/// `scale-at`: a number more than 0 and at most 1 (`0.8`), or a percentage
/// written as text (`80%`).
pub(super) fn scale_at(cx: &KeyContext, v: &Value) -> Result<f64, ManifestError> {
    let allowed = "a number more than 0 and at most 1, such as 0.8 (or a percentage such as 80%)";
    let x = match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => {
            let t = s.trim();
            match t.strip_suffix('%') {
                Some(p) => p.trim().parse::<f64>().ok().map(|p| p / 100.0),
                None => t.parse::<f64>().ok(),
            }
        }
        _ => None,
    };
    let Some(x) = x else { return Err(cx.wrong_type(v, allowed)) };
    if !(x > 0.0 && x <= 1.0) {
        return Err(cx.err(format!("{} is not allowed; allowed: {allowed}", shown_scalar(v))));
    }
    Ok(x)
}

/// `scale-down-after`: any duration up to a year.
pub(super) fn scale_down_after(cx: &KeyContext, v: &Value) -> Result<u64, ManifestError> {
    long_duration(cx, v)
}

/// `lb-policy`.
pub(super) fn lb_policy(cx: &KeyContext, v: &Value) -> Result<LbPolicy, ManifestError> {
    let allowed = format!("one of {}", LbPolicy::ALLOWED);
    let s = cx.string(v, &allowed)?;
    LbPolicy::parse(s.trim()).ok_or_else(|| cx.err(format!("{s:?} is not a policy; allowed: {allowed}")))
}

/// `drain-timeout`.
pub(super) fn drain_timeout(cx: &KeyContext, v: &Value) -> Result<u64, ManifestError> {
    long_duration(cx, v)
}

/// `restart-policy`.
pub(super) fn restart_policy(cx: &KeyContext, v: &Value) -> Result<RestartPolicy, ManifestError> {
    let allowed = format!("one of {}", RestartPolicy::ALLOWED);
    let s = cx.string(v, &allowed)?;
    RestartPolicy::parse(s.trim()).ok_or_else(|| cx.err(format!("{s:?} is not a policy; allowed: {allowed}")))
}

/// `state-file`: a file path whose folder exists.
pub(super) fn state_file(cx: &KeyContext, v: &Value) -> Result<PathBuf, ManifestError> {
    let allowed = "a file path for the app's state.json, absolute or relative to the manifest's folder";
    let s = cx.nonempty_string(v, allowed)?;
    let p = resolve(cx.doc.dir, &s);
    if p.is_dir() {
        return Err(cx.err(format!("{} is a folder; allowed: {allowed}", p.display())));
    }
    if let Some(parent) = p.parent() {
        if !parent.is_dir() {
            return Err(cx.err(format!("the folder {} does not exist; allowed: {allowed}, in an existing folder", parent.display())));
        }
    }
    Ok(p)
}

/// `idle-timeout`.
pub(super) fn idle_timeout(cx: &KeyContext, v: &Value) -> Result<u64, ManifestError> {
    long_duration(cx, v)
}

/// `keep-releases`: 1 to 100.
pub(super) fn keep_releases(cx: &KeyContext, v: &Value) -> Result<u32, ManifestError> {
    let allowed = "a whole number from 1 (the current release only: no rollback) to 100";
    whole_in(cx, v, allowed, 1..=100, "would keep not even the current release")
}

/// `start-timeout`: more than 0, at most a year.
pub(super) fn start_timeout(cx: &KeyContext, v: &Value) -> Result<u64, ManifestError> {
    let ms = long_duration(cx, v)?;
    if ms == 0 {
        return Err(
            cx.err(format!("0 would stop every copy before it starts; allowed: more than 0: {DURATION_ALLOWED}, at most 8760h (a year)"))
        );
    }
    Ok(ms)
}

/// `request-timeout`: more than 0, at most [`MAX_REQUEST_TIMEOUT_MS`].
pub(super) fn request_timeout(cx: &KeyContext, v: &Value) -> Result<u64, ManifestError> {
    let allowed = format!("more than 0 and at most 30s: {DURATION_ALLOWED}");
    let ms = cx.duration(v, &allowed)?;
    if ms == 0 {
        return Err(cx.err(format!("0 would never wait for the app; allowed: {allowed}")));
    }
    if ms > MAX_REQUEST_TIMEOUT_MS {
        return Err(cx.err(format!("{} is longer than 30s; allowed: {allowed}", shown_scalar(v))));
    }
    Ok(ms)
}

/// `max-connections`: 1 to [`MAX_CONNECTIONS`].
pub(super) fn max_connections(cx: &KeyContext, v: &Value) -> Result<u32, ManifestError> {
    let allowed = format!("a whole number of open visitor connections, at least 1 (and at most {MAX_CONNECTIONS})");
    let n = cx.uint(v, &allowed)?;
    if n < 1 {
        return Err(cx.err(format!("{n} would let no visitor in; allowed: {allowed}")));
    }
    if n > MAX_CONNECTIONS {
        return Err(cx.err(format!("{n} is too many; allowed: {allowed}")));
    }
    Ok(n as u32)
}

/// `trusted-proxies`: a list of addresses or CIDR ranges (one may be
/// written alone), kept in their plain form (`10.0.0.0/8`, `192.0.2.7`).
pub(super) fn trusted_proxies(cx: &KeyContext, v: &Value) -> Result<Vec<Cidr>, ManifestError> {
    let allowed = "a list of IP addresses or CIDR ranges of the proxies in front, \
                   such as [127.0.0.1, 10.0.0.0/8, \"2001:db8::/32\"]";
    let items: Vec<&Value> = match v {
        Value::Sequence(seq) => seq.iter().collect(),
        Value::String(_) => vec![v],
        other => return Err(cx.wrong_type(other, allowed)),
    };
    let mut out: Vec<Cidr> = Vec::with_capacity(items.len());
    for item in items {
        let s = cx.nonempty_string(item, allowed)?;
        let Some(range) = Cidr::parse(&s) else {
            return Err(cx.err(format!("{s:?} is not an IP address or CIDR range; allowed: {allowed}")));
        };
        if !out.contains(&range) {
            out.push(range);
        }
    }
    Ok(out)
}

/// `r-path`: a name looked up on PATH when the copy starts, or a path
/// (with a `/` or a `~`) to a file that exists now.
pub(super) fn r_path(cx: &KeyContext, v: &Value) -> Result<String, ManifestError> {
    let allowed = "the R executable: a name found on PATH, such as R, or a path to it \
                   (relative to the manifest's folder)";
    let s = cx.nonempty_string(v, allowed)?;
    let s = s.trim();
    if !(s.contains('/') || s.starts_with('~')) {
        return Ok(s.to_string());
    }
    let p = resolve(cx.doc.dir, s);
    if !p.is_file() {
        let what = if p.exists() { "is not a file" } else { "does not exist" };
        return Err(cx.err(format!("{} {what}; allowed: {allowed}", p.display())));
    }
    Ok(p.to_string_lossy().into_owned())
}

// ---------------------------------------------------------------------------
// Shared by several keys
// ---------------------------------------------------------------------------

/// `app-name` / `app-group`: `[a-z0-9][a-z0-9-]*`.
fn name(cx: &KeyContext, v: &Value) -> Result<String, ManifestError> {
    let s = cx.string(v, NAME_ALLOWED)?;
    if !valid_name(&s) {
        return Err(cx.err(format!("{s:?} is not a valid name; allowed: {NAME_ALLOWED}")));
    }
    Ok(s)
}

/// `drain-timeout`, `idle-timeout`: any duration up to a year.
fn long_duration(cx: &KeyContext, v: &Value) -> Result<u64, ManifestError> {
    let allowed = format!("{DURATION_ALLOWED}, at most 8760h (a year)");
    let ms = cx.duration(v, &allowed)?;
    if ms > MAX_LONG_DURATION_MS {
        return Err(cx.err(format!("{} is too long; allowed: {allowed}", shown_scalar(v))));
    }
    Ok(ms)
}

/// `[a-z0-9][a-z0-9-]*`, at most [`MAX_NAME_LEN`] characters.
fn valid_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_NAME_LEN
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// The key's folder `p` exists and is a folder (working-dir, given or the
/// default).
pub(super) fn check_dir(cx: &KeyContext, p: &Path) -> Result<(), ManifestError> {
    if p.is_dir() {
        return Ok(());
    }
    let what = if p.exists() { "is not a folder" } else { "does not exist" };
    Err(cx.err(format!(
        "{} {what}; allowed: an existing folder, absolute or relative to the manifest's folder {}",
        p.display(),
        cx.doc.dir.display()
    )))
}

// ---------------------------------------------------------------------------
// Checks that need several keys
// ---------------------------------------------------------------------------

/// `max-replicas` as given, at least `replicas`; not given: `replicas` (the
/// app does not grow). `cx` is for max-replicas.
pub(super) fn max_replicas_over_replicas(cx: &KeyContext, given: Option<u32>, replicas: u32) -> Result<u32, ManifestError> {
    match given {
        None => Ok(replicas),
        Some(n) if n >= replicas => Ok(n),
        Some(n) => Err(cx.err(format!(
            "{n} is fewer than replicas ({replicas}), the least number of active copies; allowed: a whole number, at least replicas ({replicas})"
        ))),
    }
}

/// The entrypoint file: `entrypoint-file` when given, which must be a file
/// in working-dir; else the layout the folder has, as Shiny Server finds it:
/// `app.R`, or `ui.R` + `server.R` (with `global.R`; named by `server.R`),
/// or the folder's one R Markdown document with `runtime: shiny` (or
/// `shinyrmd`). `cx` is for entrypoint-file, given or not.
pub(super) fn entrypoint(cx: &KeyContext, working_dir: &Path, given: Option<String>) -> Result<String, ManifestError> {
    if let Some(entrypoint) = given {
        let entry_path = working_dir.join(&entrypoint);
        if entry_path.is_file() {
            return Ok(entrypoint);
        }
        let what = if entry_path.is_dir() { "is a folder, not a file" } else { "does not exist" };
        return Err(cx.err(format!(
            "missing entrypoint file {} ({what}); allowed: a file in working-dir {} (entrypoint-file, default app.R)",
            entry_path.display(),
            working_dir.display()
        )));
    }
    if working_dir.join("app.R").is_file() {
        return Ok("app.R".to_string());
    }
    if working_dir.join("server.R").is_file() && working_dir.join("ui.R").is_file() {
        return Ok("server.R".to_string());
    }
    let documents = shiny_documents(working_dir);
    if let [only] = documents.as_slice() {
        return Ok(only.clone());
    }
    let found = if documents.is_empty() {
        String::new()
    } else {
        format!("; it has several R Markdown documents with runtime: shiny ({}): name one with entrypoint-file", documents.join(", "))
    };
    Err(cx.err(format!(
        "missing entrypoint file {} (does not exist){found}; allowed: app.R, ui.R with server.R, or one R Markdown document with runtime: shiny in working-dir {} (or entrypoint-file naming a file there; default app.R)",
        working_dir.join("app.R").display(),
        working_dir.display()
    )))
}

/// The R Markdown documents in `dir` whose front matter says `runtime:
/// shiny` or `shinyrmd` (or `shiny_prerendered`), sorted.
fn shiny_documents(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut out: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|n| n.to_ascii_lowercase().ends_with(".rmd"))
        .filter(|n| std::fs::read_to_string(dir.join(n)).is_ok_and(|t| is_shiny_document(&t)))
        .collect();
    out.sort();
    out
}

/// True when an R Markdown document's front matter asks for Shiny.
pub fn is_shiny_document(text: &str) -> bool {
    let mut lines = text.lines();
    if lines.next().map(str::trim) != Some("---") {
        return false;
    }
    lines.take_while(|l| l.trim() != "---").any(|l| {
        let l = l.trim();
        l.strip_prefix("runtime:")
            .map(|v| matches!(v.trim().trim_matches(|c| c == '"' || c == '\''), "shiny" | "shinyrmd" | "shiny_prerendered"))
            .unwrap_or(false)
    })
}

// ---------------------------------------------------------------------------
// Paths
// ---------------------------------------------------------------------------

/// `path` made absolute (against the current folder) without `.` parts.
pub(super) fn absolute(path: &Path) -> PathBuf {
    let p = if path.is_absolute() { path.to_path_buf() } else { std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/")).join(path) };
    clean(&p)
}

/// A path from the manifest: `~/…` is under $HOME, relative is relative to
/// the manifest's folder. `.` parts are dropped; `..` parts are kept, so a
/// symlinked folder resolves as the system resolves it.
pub(super) fn resolve(base: &Path, s: &str) -> PathBuf {
    let s = s.trim();
    let p = match (s == "~" || s.starts_with("~/"), std::env::var_os("HOME")) {
        (true, Some(h)) if !h.is_empty() => PathBuf::from(h).join(s[1..].trim_start_matches('/')),
        _ => PathBuf::from(s),
    };
    clean(&if p.is_absolute() { p } else { base.join(p) })
}

fn clean(p: &Path) -> PathBuf {
    p.components().filter(|c| !matches!(c, Component::CurDir)).collect()
}

/// `pool`: `false` starts this app's copies cold, never from the pool
/// (README, "Sleep and wake").
pub(super) fn pool(cx: &KeyContext, v: &Value) -> Result<bool, ManifestError> {
    match v {
        Value::Bool(b) => Ok(*b),
        other => Err(cx.err(format!("{}; allowed: true or false (false: copies start cold, never from the pool)", shown_scalar(other)))),
    }
}
