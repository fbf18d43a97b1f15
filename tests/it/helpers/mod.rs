//! Shared helpers: a temporary SHINYCTL_HOME per test, the real binary, a
//! real R Shiny app, a tiny HTTP client, and waiting on conditions with a
//! deadline. Every process a test started is ended by PID when its `Env`
//! drops, once it is sure the PID still names that process; a test that
//! runs past `TEST_LIMIT` is ended with its processes and a clear message.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

mod builds;
mod cleanup;
mod env;
mod http;
mod session;
mod users;

pub use builds::*;
use cleanup::*;
pub use env::*;
pub use http::*;
pub use session::*;
pub use users::*;

/// The binary under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_shinyctl")
}

/// The variable that tells the suite the machine is loaded:
/// `SHINYCTL_TEST_SLOW=3` makes every deadline a test waits on three times
/// as long (`wait_until`, `wait_gone`, `wait_roles`, `wait_http_ok`, the
/// test's own limit). What a test asserts stays as it is: a window that
/// must hold, a bound the docs promise.
pub const SLOW_VAR: &str = "SHINYCTL_TEST_SLOW";

/// The factor [`SLOW_VAR`] sets (at least 1; 1 when unset or unreadable).
pub fn slow_factor() -> f64 {
    std::env::var(SLOW_VAR).ok().and_then(|v| v.parse::<f64>().ok()).filter(|f| f.is_finite() && *f >= 1.0).unwrap_or(1.0)
}

/// A deadline scaled for a loaded machine by [`SLOW_VAR`].
pub fn slow(d: Duration) -> Duration {
    d.mul_f64(slow_factor())
}

/// The opt-out for tests that need root: CI runs the suite as root, so
/// such a test fails when not root (`#[ignore]` would drop it from CI),
/// unless `SHINYCTL_TEST_NOT_ROOT=1` says this run knows; then it prints
/// SKIPPED and passes.
pub const NOT_ROOT_VAR: &str = "SHINYCTL_TEST_NOT_ROOT";

/// True when the tests run as root.
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// For a test that needs root (`why`): true when it runs as root; false,
/// after printing SKIPPED, when not and [`NOT_ROOT_VAR`] is set; panics
/// otherwise.
pub fn needs_root(why: &str) -> bool {
    if is_root() {
        return true;
    }
    let opted_out = std::env::var(NOT_ROOT_VAR).is_ok_and(|v| v == "1");
    assert!(opted_out, "this test needs root ({why}); CI runs the suite as root. Set {NOT_ROOT_VAR}=1 to skip it knowingly");
    let test = std::thread::current().name().unwrap_or("a test").to_string();
    // Straight to stderr, so it shows even when cargo captures the output.
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: not root ({why}) and {NOT_ROOT_VAR}=1");
    false
}

/// Waits until `cond` holds, polling every 50 ms, or panics with `what`
/// after `timeout` (scaled by [`SLOW_VAR`]).
pub fn wait_until<T>(timeout: Duration, what: &str, mut cond: impl FnMut() -> Option<T>) -> T {
    let timeout = slow(timeout);
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = cond() {
            return v;
        }
        if Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for: {what}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Checks `cond` every 50 ms for `window` and panics with `what` the first
/// time it does not hold: for what must stay true, such as a copy left down.
pub fn holds_for(window: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + window;
    while Instant::now() < end {
        assert!(cond(), "no longer true: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Unix time in ms, as the daemon records it.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

/// Waits until the wall clock reaches `unix_ms`.
pub fn wait_clock(unix_ms: u64) {
    while now_ms() < unix_ms {
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until the process is gone, or panics with `what` after `timeout`.
pub fn wait_gone(pid: u32, timeout: Duration, what: &str) {
    wait_until(timeout, what, || (!pid_alive(pid)).then_some(()));
}

/// An app name no other test run on this machine uses at the same time
/// (`name` and this process's ID). Copy ports are seeded from the app
/// name, so a test that checks a copy keeps its port, or finds its first
/// start's disk empty, must not share its name with another suite's test
/// running beside it.
pub fn unique(name: &str) -> String {
    format!("{name}{}", std::process::id())
}

/// A free TCP port for an app, between 10000 and 19999: below the copies'
/// 20000–29999 and the kernel's ephemeral range (32768 and up), so no
/// outgoing connection is given it between now and the daemon's bind (as
/// one from `bind(0)` could be); bindable now on 0.0.0.0, and never handed
/// out twice by this test process. Each process starts at its own place.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<BTreeSet<u16>> = std::sync::Mutex::new(BTreeSet::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    let start = (std::process::id() as usize * 7919 + now_ms() as usize) % 10_000;
    (0..10_000)
        .map(|i| 10_000 + ((start + i * 7) % 10_000) as u16)
        .find(|&p| !given.contains(&p) && std::net::TcpListener::bind(("0.0.0.0", p)).is_ok())
        .inspect(|&p| {
            given.insert(p);
        })
        .expect("a free port between 10000 and 19999")
}

/// True while a process with this PID exists and is not a zombie.
pub fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat.rsplit_once(')').and_then(|(_, r)| r.trim_start().chars().next());
            !matches!(state, Some('Z') | Some('X') | None)
        }
        Err(_) => false,
    }
}

/// The command line of a process, arguments joined by spaces.
pub fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).split('\0').filter(|s| !s.is_empty()).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// True when process `pid` is a copy's R: R's binary run as the launcher
/// runs it (its run expression on its standard input), cold or claimed.
pub fn is_copy_r(pid: u32) -> bool {
    let cmd = cmdline(pid);
    cmd.ends_with(&format!("/R {}", shinyctl::launcher::R_ARGS.join(" ")))
}

/// An app that starts well the first time and then, at every later start
/// (a wake, a restart after a crash), runs `how` first: it finds a mark its
/// first start left on its disk, which is kept through sleep and restarts
/// (`Sys.sleep(3600)`: it hangs; `stop(...)`: it fails).
pub fn second_start(how: &str) -> String {
    format!(
        "mark <- file.path(Sys.getenv('SHINYCTL_SCRATCH'), 'started-once')\n\
         if (file.exists(mark)) {how}\n\
         writeLines('x', mark)\n\
         shiny::shinyApp(shiny::fluidPage('up'), function(input, output) {{}})\n"
    )
}

/// Sends a signal to a process by PID.
pub fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) with a PID this test started.
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

/// Sends a signal to a process group (copies lead their own).
pub fn signal_group(pgid: u32, sig: i32) {
    // SAFETY: kill(2) on a group this test started.
    unsafe {
        libc::kill(-(pgid as i32), sig);
    }
}
