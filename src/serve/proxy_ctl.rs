//! The daemon's side of the load balancer: start it (or adopt the one that
//! runs), watch it, push the copies table, read its traffic figures.

use std::io::Read;
use std::time::Duration;

use hyper::Method;
use tokio::sync::mpsc::UnboundedSender;

use crate::home::{write_atomic, Home};
use crate::wire::{ProxyStats, ProxyTable, BUILD};

use crate::wire::lb_start::TAKEOVER_ENV;
use crate::wire::uds;

use super::Event;

/// How long the daemon waits on the load balancer's socket.
const TIMEOUT: Duration = Duration::from_millis(800);

/// What the daemon knows of the load balancer.
pub struct ProxyCtl {
    /// Its PID, once it answered.
    pid: Option<u32>,
    /// The last table it accepted; a new one is pushed only when it differs.
    pushed: Option<ProxyTable>,
    /// The table to push (kept to push again after a restart).
    pending: Option<ProxyTable>,
    /// A load balancer of another build, stopped once the new one serves.
    retiring: Option<u32>,
    /// The load balancers told to stop (PID, start time), each told once;
    /// kept while they finish.
    retired: Vec<(u32, u64)>,
}

impl ProxyCtl {
    /// Makes sure the cookie key exists (see [`ensure_cookie_key`]).
    pub fn new(home: &Home) -> anyhow::Result<ProxyCtl> {
        ensure_cookie_key(home)?;
        Ok(ProxyCtl { pid: None, pushed: None, pending: None, retiring: None, retired: Vec::new() })
    }

    /// Forgets the load balancer (it exited).
    pub fn forget(&mut self) {
        self.pid = None;
        self.pushed = None;
    }

    /// Its PID, when it runs.
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// Adopts the running load balancer when it is of this build, or starts
    /// one: beside a running one of another build (which hands its listening
    /// sockets over and is stopped 0.25 s after the new one has its table),
    /// or afresh. Then watches it.
    pub async fn ensure(&mut self, home: &Home, events: &UnboundedSender<Event>) {
        if self.pid.is_some() {
            return;
        }
        // The stats of the load balancer this ends up with (they carry its
        // PID and settings).
        let mut answered = self.stats(home).await;
        match &answered {
            Some(stats) if stats.build == BUILD => {}
            Some(stats) => {
                tracing::info!(pid = stats.pid, build = %stats.build, "replacing the load balancer of another build with {BUILD}");
                self.retiring = Some(stats.pid);
                answered = None;
            }
            None => {}
        }
        if answered.is_none() {
            // The load balancer only reads the key; it may have gone since
            // the daemon started.
            if let Err(e) = ensure_cookie_key(home) {
                tracing::error!("cannot start the load balancer: {e:#}");
                return;
            }
            let env: &[(&str, &str)] = if self.retiring.is_some() { &[(TAKEOVER_ENV, "1")] } else { &[] };
            let mut child = match crate::sys::spawn::spawn_self(home, "proxy", env) {
                Ok(c) => c,
                Err(e) => {
                    tracing::error!("cannot start the load balancer: {e:#}");
                    self.pid = None;
                    return;
                }
            };
            tracing::info!(pid = child.id(), "started the load balancer");
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            loop {
                answered = self.stats(home).await.filter(|s| s.pid == child.id());
                if answered.is_some() {
                    break;
                }
                if let Ok(Some(status)) = child.try_wait() {
                    tracing::error!("the load balancer exited at start ({status}); see above");
                    self.pid = None;
                    return;
                }
                if tokio::time::Instant::now() >= deadline {
                    tracing::error!("the load balancer did not answer within 10 s");
                    self.pid = None;
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        if let Some(stats) = answered {
            let pid = stats.pid;
            self.pid = Some(pid);
            tracing::info!(pid, "load balancer running");
            if let Ok(bytes) = serde_json::to_vec_pretty(&stats.settings) {
                let _ = write_atomic(&home.proxy_settings(), &bytes, 0o600);
            }
            let events = events.clone();
            // The load balancer is no copy; its exit watcher reports as one
            // of a pseudo-app and is turned into ProxyExit.
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            crate::serve::copies::act::watch_exit(String::new(), pid, tx);
            tokio::spawn(async move {
                if rx.recv().await.is_some() {
                    let _ = events.send(Event::ProxyExit);
                }
            });
            self.pushed = None;
            if let Some(table) = self.pending.clone() {
                self.push(home, table).await;
            }
        }
    }

    /// Stops the load balancer of another build once the new one has its
    /// table and (`listening`) the listening sockets: 0.25 s later, so the
    /// new one serves beside it first. It answers what it is in the middle
    /// of for up to 5 s, then exits. Also whichever load balancer of this
    /// home still holds `proxy/lock` beside the one that answers: a daemon
    /// that ended between starting the new one and stopping the old one
    /// left the old one running (it would serve the same sockets with an
    /// old table for ever), and only the lock still names it.
    pub async fn retire_old(&mut self, home: &Home, listening: bool) {
        if self.pushed.is_none() || !listening {
            return;
        }
        let Some(current) = self.pid else { return };
        let mut old: Vec<(u32, u64)> = Vec::new();
        for pid in self.retiring.take().into_iter().chain(lock_holder(home)) {
            let Some(start) = crate::sys::procfs::start_ticks(pid) else { continue };
            if pid != current && !old.contains(&(pid, start)) && !self.retired.contains(&(pid, start)) && is_balancer_of(home, pid) {
                old.push((pid, start));
            }
        }
        if old.is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        for (pid, start) in old {
            if crate::sys::procfs::is_alive(pid, start) {
                tracing::info!(pid, "stopping the load balancer {pid}, which {current} replaced");
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGTERM);
            }
            self.retired.push((pid, start));
        }
        self.retired.retain(|&(pid, start)| crate::sys::procfs::is_alive(pid, start));
    }

    /// Reads the load balancer's stats; `None` when it doesn't answer.
    pub async fn stats(&mut self, home: &Home) -> Option<ProxyStats> {
        let stats = fetch_stats(home, TIMEOUT).await?;
        // One of another build is never taken for ours: ensure replaces it.
        if stats.build == BUILD {
            self.pid = Some(stats.pid);
        }
        Some(stats)
    }

    /// Pushes the table when it differs from the last one accepted, and
    /// writes it to proxy/table.json for people to read.
    /// Returns true when the load balancer has this table.
    pub async fn push(&mut self, home: &Home, table: ProxyTable) -> bool {
        if self.pushed.as_ref() == Some(&table) {
            return true;
        }
        self.pending = Some(table.clone());
        let Ok(body) = serde_json::to_vec(&table) else { return false };
        match uds::request(&home.proxy_sock(), Method::PUT, "/table", Some(body.clone()), TIMEOUT).await {
            Ok((status, _)) if status.is_success() => {
                if let Ok(pretty) = serde_json::to_vec_pretty(&table) {
                    let _ = crate::home::write_replace(&home.proxy_table(), &pretty, 0o600);
                }
                self.pushed = Some(table);
                true
            }
            Ok((status, body)) => {
                tracing::error!("the load balancer refused the table: {status} {}", String::from_utf8_lossy(&body));
                false
            }
            Err(e) => {
                tracing::warn!("cannot push the table to the load balancer: {e:#}");
                false
            }
        }
    }
}

/// The PID `proxy/lock` names: the load balancer that holds it (or held
/// it last).
fn lock_holder(home: &Home) -> Option<u32> {
    std::fs::read_to_string(home.proxy_lock()).ok()?.trim().parse().ok()
}

/// True when `pid` is a load balancer (`shinyctl proxy`) of this home.
fn is_balancer_of(home: &Home, pid: u32) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else { return false };
    if cmdline.split(|b| *b == 0).nth(1) != Some(b"proxy".as_slice()) {
        return false;
    }
    let want = format!("SHINYCTL_HOME={}", home.root.display());
    std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| env.split(|b| *b == 0).any(|kv| kv == want.as_bytes()))
}

/// How long `status` waits for the load balancer's figures: it answers
/// without them rather than late.
pub const STATUS_TIMEOUT: Duration = Duration::from_millis(250);

/// Reads the load balancer's stats; `None` when it doesn't answer within
/// `timeout`.
pub async fn fetch_stats(home: &Home, timeout: Duration) -> Option<ProxyStats> {
    let (status, body) = uds::request(&home.proxy_sock(), Method::GET, "/stats", None, timeout).await.ok()?;
    if !status.is_success() {
        return None;
    }
    serde_json::from_slice(&body).ok()
}

/// Makes the sticky cookie's key, `proxy/cookie.key` (32 random bytes, mode
/// 0600), unless it is there with the right length. The daemon alone makes
/// it, before it starts a load balancer, which only reads it. A new key
/// places visitors anew.
pub fn ensure_cookie_key(home: &Home) -> anyhow::Result<()> {
    let path = home.cookie_key();
    match std::fs::read(&path) {
        Ok(bytes) if bytes.len() == crate::wire::lb_start::COOKIE_KEY_LEN => return Ok(()),
        Ok(bytes) => tracing::warn!(
            "{} is {} bytes, not {}; making a new key (visitors are placed anew)",
            path.display(),
            bytes.len(),
            crate::wire::lb_start::COOKIE_KEY_LEN
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => anyhow::bail!("cannot read {}: {e}", path.display()),
    }
    let mut key = [0u8; crate::wire::lb_start::COOKIE_KEY_LEN];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut key))
        .map_err(|e| anyhow::anyhow!("cannot read /dev/urandom: {e}"))?;
    write_atomic(&path, &key, 0o600).map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_daemon_makes_the_cookie_key_keeps_a_good_one_and_replaces_a_bad_one() {
        let temp = tempfile::tempdir().unwrap();
        let home = Home { root: temp.path().join("home") };
        home.ensure().unwrap();
        let path = home.cookie_key();
        ensure_cookie_key(&home).unwrap();
        let made = std::fs::read(&path).unwrap();
        assert_eq!(made.len(), crate::wire::lb_start::COOKIE_KEY_LEN);
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        ensure_cookie_key(&home).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), made, "a good key is kept: visitors stay placed");
        std::fs::write(&path, b"short").unwrap();
        ensure_cookie_key(&home).unwrap();
        let replaced = std::fs::read(&path).unwrap();
        assert_eq!(replaced.len(), crate::wire::lb_start::COOKIE_KEY_LEN);
        assert_ne!(replaced, made);
    }
}
