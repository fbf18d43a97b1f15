//! The live copies table: what the daemon pushed, plus what the load
//! balancer learns itself (open connections, copies that refused, the idle
//! upstream connections). A push builds a new [`Table`] and swaps it in
//! whole, so a request sees either the old table or the new one, never a
//! mix; what the load balancer learned about a copy carries over as long as
//! the new table names the same process on the same port.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use hyper::header::HeaderValue;
use tokio::sync::watch;

use crate::manifest::{Cidr, DEFAULT_MAX_CONNECTIONS};
use crate::proxy::copies::balance::Candidate;
use crate::proxy::copies::cookie;
use crate::proxy::copies::copy_state::{CopyState, STALL_AFTER_MS};
use crate::proxy::copies::retry::Deaths;
use crate::proxy::daemon_link::WakeSlot;
use crate::sys::clock::mono_ms;
use crate::wire::{AppTraffic, CopyTraffic, LbPolicy, LeavingCopy, ProxyTable, Refusing, Role};

/// The longest a request is held while no copy can take it
/// (README, "Staying up": "a request waits up to 15 seconds").
pub const MAX_HOLD: Duration = Duration::from_secs(15);
/// The longest a request is held while its app wakes
/// (README, "Sleep": a wake holds a request 30 seconds at most).
pub const MAX_WAKE_HOLD: Duration = Duration::from_secs(30);

/// One copy in the live table.
pub struct LiveCopy {
    /// The copy number the cookie names.
    pub copy: u32,
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// How it is treated.
    pub role: Role,
    /// Its process, as the daemon last saw it.
    pub pid: u32,
    /// Its R process, when the daemon named it: the one whose threads are
    /// watched (`liveness.rs`).
    pub r_pid: Option<u32>,
    /// The signed cookie value that names it (`3.<hex>`).
    pub cookie: Box<str>,
    /// The whole `Set-Cookie` header that places a visitor on it.
    pub set_cookie: HeaderValue,
    /// Counters, known-down flag and idle connections.
    pub state: Arc<CopyState>,
    /// The daemon was told that this spare took a visitor because every
    /// active copy was full: told once per table, so a burst grows the app
    /// once, not once a visitor.
    pub full_reported: AtomicBool,
}

impl LiveCopy {
    /// The copy as the balancer sees it at unix ms `now` (down marks go by
    /// the wall clock, waits by [`mono_ms`]). A copy seen
    /// stalled gets a probe (`stall.rs`) that tells when it answers again.
    pub fn candidate(&self, now: u64) -> Candidate {
        let mono = mono_ms();
        let stalled = self.state.silent_ms(mono) >= STALL_AFTER_MS;
        if stalled {
            crate::proxy::copies::stall::probe(&self.state, self.port);
        }
        Candidate {
            role: self.role,
            down: self.state.is_down(now),
            connections: self.state.connections.load(Ordering::Relaxed),
            sessions: self.state.sessions.load(Ordering::Relaxed) + self.state.placed(mono),
            stalled,
            last_answer_ms: self.state.last_answer_ms.load(Ordering::Relaxed),
        }
    }
}

/// Counters of an app that outlive table pushes (kept by app name).
#[derive(Default)]
pub struct AppCounters {
    /// Unix ms of the last request, 0 if none.
    pub last_request_ms: AtomicU64,
    /// The round-robin counter.
    pub rr: AtomicUsize,
    /// Visitors' connections admitted and open (under `max-connections`).
    pub open: AtomicUsize,
    /// Requests that were in flight when copies died, and those refused
    /// for a while because of it.
    pub deaths: Mutex<Deaths>,
    /// The wake asked of the daemon, shared by the requests that arrive
    /// while it goes on (`None` inside until it ends).
    pub wake: WakeSlot,
}

/// One app in the live table.
pub struct LiveApp {
    /// The app's name, for the daemon and the logs.
    pub name: String,
    /// The listen address.
    pub host: String,
    /// The public port.
    pub port: u16,
    /// How new visitors are spread.
    pub policy: LbPolicy,
    /// How long a request is held while no copy can take it.
    pub hold: Duration,
    /// The app sleeps: a request asks the daemon for a wake.
    pub asleep: bool,
    /// Stopped by `shinyctl stop`: a request gets the page that says so.
    pub stopped: bool,
    /// Every copy left down, none to come back: a request gets the page
    /// that says so at once.
    pub down: bool,
    /// Its port is listened on; an app being deleted is not, but keeps
    /// carrying (and counting) the connections it has.
    pub listening: bool,
    /// How long a request is held while the app wakes.
    pub wake_hold: Duration,
    /// `lb_<port>`.
    pub cookie_name: Box<str>,
    /// The most visitors' connections open at once (`max-connections`).
    pub max_connections: usize,
    /// Proxies in front whose forwarded headers are believed and whose
    /// connections no per-address cap limits (`trusted-proxies`).
    pub trusted: Vec<Cidr>,
    /// `max-sessions` and `max-replicas` when the app has a session limit
    /// (README, "Capacity").
    pub capacity: Option<(u64, u32)>,
    /// How long a new visitor is held while every copy is full at
    /// `max-replicas`: the app's request-timeout.
    pub busy_hold: Duration,
    /// The copies, oldest first (the daemon's order).
    pub copies: Vec<LiveCopy>,
    /// Counters kept across pushes.
    pub counters: Arc<AppCounters>,
}

impl LiveApp {
    /// The index of copy number `copy`.
    pub fn index_of(&self, copy: u32) -> Option<usize> {
        self.copies.iter().position(|c| c.copy == copy)
    }

    /// True when `ip` is one of the app's trusted proxies.
    pub fn trusts(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|c| c.contains(ip))
    }

    /// The copy a `Cookie` header's `lb_<port>` names, when its value is
    /// the right signature for a copy in this table.
    pub fn sticky_copy(&self, cookie_header: &[u8]) -> Option<u32> {
        let value = cookie::find(cookie_header, &self.cookie_name)?;
        let copy = cookie::copy_of(value)?;
        let c = &self.copies[self.index_of(copy)?];
        cookie::same(value.as_bytes(), c.cookie.as_bytes()).then_some(copy)
    }
}

/// A copy out of the table is still reported this long after the push
/// that took it out, even with nothing in flight yet: a request that read
/// the table just before the swap counts itself against the copy a moment
/// after.
pub const LEAVING_LINGER_MS: u64 = 1_000;

/// A copy a push took out of the table, kept while answers to it may still
/// be under way, so `/stats` tells the daemon not to stop it yet.
#[derive(Clone)]
pub struct Leaving {
    /// Its app.
    pub app: String,
    /// The copy number.
    pub copy: u32,
    /// Its process, as the table named it.
    pub pid: u32,
    /// Its port.
    pub port: u16,
    /// [`mono_ms`] when the push took it out.
    pub left_ms: u64,
    /// Its counters, shared with the requests still under way.
    pub state: Arc<CopyState>,
}

impl Leaving {
    /// Requests in flight to it (open WebSockets not counted).
    pub fn requests(&self) -> u64 {
        self.state.connections.load(Ordering::Relaxed).saturating_sub(self.state.sessions.load(Ordering::Relaxed))
    }

    /// Still worth keeping at `now` ([`mono_ms`]): while anything is open
    /// to it, sessions too, so a copy a push names again (a daemon that just
    /// started pushes its first table before it has probed the copies it
    /// adopted) takes back its counts.
    fn lingers(&self, now: u64) -> bool {
        self.state.connections.load(Ordering::Relaxed) > 0 || now < self.left_ms + LEAVING_LINGER_MS
    }
}

/// One version of the whole table.
#[derive(Default)]
pub struct Table {
    /// The table as the daemon pushed it (`GET /table`).
    pub source: ProxyTable,
    /// The apps, in the daemon's order.
    pub apps: Vec<Arc<LiveApp>>,
    /// Copies earlier pushes took out, while requests to them may still be
    /// in flight.
    pub leaving: Vec<Leaving>,
}

impl Table {
    /// Builds the live form of `source`, carrying over from `prev` the
    /// counters of apps with the same name and the state of copies with
    /// the same number, process and port.
    pub fn build(source: ProxyTable, key: &[u8], prev: &Table) -> Table {
        let mut apps = Vec::with_capacity(source.apps.len());
        for app in &source.apps {
            let old = prev.apps.iter().find(|a| a.name == app.name);
            let mut copies: Vec<LiveCopy> = Vec::with_capacity(app.copies.len());
            for c in &app.copies {
                if copies.iter().any(|x| x.copy == c.copy) {
                    tracing::warn!(app = %app.name, copy = c.copy, "the table names a copy twice; the first one counts");
                    continue;
                }
                let state = old
                    .and_then(|a| a.copies.iter().find(|x| x.copy == c.copy && x.pid == c.pid && x.port == c.port))
                    .map(|x| x.state.clone())
                    .or_else(|| {
                        let back = |l: &&Leaving| l.app == app.name && l.copy == c.copy && l.pid == c.pid && l.port == c.port;
                        prev.leaving.iter().find(back).map(|l| l.state.clone())
                    })
                    .unwrap_or_default();
                let value = cookie::sign(key, app.route.port, c.copy);
                let set_cookie =
                    HeaderValue::from_maybe_shared(bytes::Bytes::from(cookie::set_cookie(&cookie::name(app.route.port), &value)))
                        .unwrap_or_else(|_| HeaderValue::from_static(""));
                copies.push(LiveCopy {
                    copy: c.copy,
                    port: c.port,
                    role: c.role,
                    pid: c.pid,
                    r_pid: c.r_pid,
                    cookie: value.into(),
                    set_cookie,
                    state,
                    full_reported: AtomicBool::new(false),
                });
            }
            let request_timeout = Duration::from_millis(app.route.request_timeout_ms);
            let (hold, wake_hold) = match app.route.request_timeout_ms {
                0 => (MAX_HOLD, MAX_WAKE_HOLD),
                _ => (MAX_HOLD.min(request_timeout), MAX_WAKE_HOLD.min(request_timeout)),
            };
            apps.push(Arc::new(LiveApp {
                name: app.name.clone(),
                host: app.route.host.to_string(),
                port: app.route.port,
                policy: app.route.lb_policy,
                hold,
                asleep: app.asleep,
                stopped: app.stopped,
                down: app.down,
                listening: app.listening,
                wake_hold,
                cookie_name: cookie::name(app.route.port).into(),
                max_connections: match app.route.max_connections {
                    0 => DEFAULT_MAX_CONNECTIONS as usize,
                    n => n as usize,
                },
                trusted: app.route.trusted_proxies.clone(),
                capacity: app.max_sessions.map(|n| (u64::from(n), app.max_replicas)),
                busy_hold: if app.route.request_timeout_ms == 0 { MAX_WAKE_HOLD } else { MAX_WAKE_HOLD.min(request_timeout) },
                copies,
                counters: old.map(|a| a.counters.clone()).unwrap_or_default(),
            }));
        }
        let leaving = leaving_after(prev, &source);
        Table { source, apps, leaving }
    }

    /// The app listening on `port`, else one being deleted whose
    /// connections on that port are still open.
    pub fn app(&self, port: u16) -> Option<&Arc<LiveApp>> {
        self.apps.iter().find(|a| a.port == port && a.listening).or_else(|| self.apps.iter().find(|a| a.port == port))
    }

    /// Traffic per app and per copy in this table (`GET /stats`), with the
    /// copies that stalled and the requests refused.
    pub fn traffic(&self) -> Vec<AppTraffic> {
        let now = mono_ms();
        self.apps
            .iter()
            .map(|a| AppTraffic {
                name: a.name.clone(),
                last_request_ms: a.counters.last_request_ms.load(Ordering::Relaxed),
                copies: a
                    .copies
                    .iter()
                    .map(|c| CopyTraffic {
                        copy: c.copy,
                        connections: c.state.connections.load(Ordering::Relaxed),
                        sessions: c.state.sessions.load(Ordering::Relaxed),
                        silent_ms: Some(c.state.silent_ms(now)).filter(|&s| s >= STALL_AFTER_MS).unwrap_or(0),
                    })
                    .collect(),
                leaving: self
                    .leaving
                    .iter()
                    .filter(|l| l.app == a.name)
                    .map(|l| LeavingCopy { copy: l.copy, pid: l.pid, requests: l.requests() })
                    .filter(|l| l.requests > 0)
                    .collect(),
                refusing: a
                    .counters
                    .deaths
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .refusing(now)
                    .into_iter()
                    .map(|(request, for_ms)| Refusing { request, for_ms })
                    .collect(),
            })
            .collect()
    }

    /// The (host, port) each app wants to listen on.
    pub fn listen_addrs(&self) -> HashMap<u16, String> {
        let mut out = HashMap::new();
        for a in self.apps.iter().filter(|a| a.listening) {
            match out.entry(a.port) {
                std::collections::hash_map::Entry::Occupied(_) => {
                    tracing::warn!(app = %a.name, "another app in the table has port {}; the first one keeps it", a.port);
                }
                std::collections::hash_map::Entry::Vacant(v) => {
                    v.insert(a.host.clone());
                }
            }
        }
        out
    }
}

/// The copies `prev` had (in its table or leaving) that `source` no longer
/// names (the same copy, process and port), kept while they may still
/// have requests in flight.
fn leaving_after(prev: &Table, source: &ProxyTable) -> Vec<Leaving> {
    let now = mono_ms();
    let named = |app: &str, copy: u32, pid: u32, port: u16| {
        source.apps.iter().any(|a| a.name == app && a.copies.iter().any(|c| c.copy == copy && c.pid == pid && c.port == port))
    };
    let mut out: Vec<Leaving> = prev.leaving.iter().filter(|l| !named(&l.app, l.copy, l.pid, l.port) && l.lingers(now)).cloned().collect();
    for a in &prev.apps {
        for c in a.copies.iter().filter(|c| !named(&a.name, c.copy, c.pid, c.port)) {
            out.push(Leaving { app: a.name.clone(), copy: c.copy, pid: c.pid, port: c.port, left_ms: now, state: c.state.clone() });
        }
    }
    out
}

/// One line for the log: `hello:8080 1=active@20001 2=warm@20002; nap:8081 asleep`.
pub fn describe(table: &ProxyTable) -> String {
    let apps: Vec<String> = table
        .apps
        .iter()
        .map(|a| {
            let mut line = format!("{}:{}", a.name, a.route.port);
            if a.asleep {
                line.push_str(" asleep");
            }
            for c in &a.copies {
                line.push_str(&format!(" {}={}@{}", c.copy, c.role.as_str(), c.port));
            }
            line
        })
        .collect();
    if apps.is_empty() {
        "no apps".into()
    } else {
        apps.join("; ")
    }
}

/// The current table, swapped whole on every push.
pub struct LiveTable {
    /// The table requests read (a read lock only long enough to clone an `Arc`).
    current: RwLock<Arc<Table>>,
    /// Bumped on every swap, so held requests wake and look again.
    changes: watch::Sender<u64>,
}

impl Default for LiveTable {
    fn default() -> Self {
        LiveTable { current: RwLock::new(Arc::new(Table::default())), changes: watch::Sender::new(0) }
    }
}

impl LiveTable {
    /// The whole current table.
    pub fn load(&self) -> Arc<Table> {
        self.current.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The current entry of the app on `port`.
    pub fn app(&self, port: u16) -> Option<Arc<LiveApp>> {
        self.current.read().unwrap_or_else(|e| e.into_inner()).app(port).cloned()
    }

    /// Swaps in a new table and wakes the held requests.
    pub fn swap(&self, table: Table) {
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(table);
        self.changes.send_modify(|v| *v += 1);
    }

    /// A receiver that sees the next swap (subscribe before looking, so a
    /// swap in between is not missed).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{ProxyApp, ProxyCopy};

    fn table(copies: &[(u32, u16, u32)]) -> ProxyTable {
        ProxyTable {
            apps: vec![ProxyApp::for_tests(
                "hello",
                LbPolicy::LeastConn,
                copies.iter().map(|&(copy, port, pid)| ProxyCopy { copy, port, role: Role::Active, pid, r_pid: None }).collect(),
            )],
        }
    }

    #[test]
    fn state_carries_over_only_for_the_same_process_and_port() {
        let key = [1u8; 32];
        let t1 = Table::build(table(&[(1, 20001, 100), (2, 20002, 200), (3, 20003, 300)]), &key, &Table::default());
        for c in &t1.apps[0].copies {
            c.state.down_at_ms.store(1000, Ordering::Relaxed);
        }
        t1.apps[0].counters.last_request_ms.store(42, Ordering::Relaxed);
        let t2 = Table::build(table(&[(1, 20001, 100), (2, 20002, 201), (3, 20009, 300)]), &key, &t1);
        let down: Vec<bool> = t2.apps[0].copies.iter().map(|c| c.candidate(1000).down).collect();
        assert_eq!(down, vec![true, false, false]);
        assert_eq!(t2.apps[0].counters.last_request_ms.load(Ordering::Relaxed), 42);
        assert_eq!(t2.apps[0].hold, MAX_HOLD);
        assert_eq!(t2.apps[0].wake_hold, Duration::from_secs(30));
    }

    #[test]
    fn a_copy_taken_out_is_reported_while_a_request_to_it_is_under_way() {
        let key = [1u8; 32];
        let t1 = Table::build(table(&[(1, 20001, 100), (2, 20002, 200)]), &key, &Table::default());
        // A request begun on copy 2 (its answer streams), and a session on it.
        let lease = crate::proxy::copies::lease::Lease::new(t1.apps[0].copies[1].state.clone());
        t1.apps[0].copies[1].state.sessions.fetch_add(1, Ordering::Relaxed);
        t1.apps[0].copies[1].state.connections.fetch_add(1, Ordering::Relaxed);
        let t2 = Table::build(table(&[(1, 20001, 100)]), &key, &t1);
        let leaving = &t2.traffic()[0].leaving;
        assert_eq!(leaving, &vec![LeavingCopy { copy: 2, pid: 200, requests: 1 }], "the session is not a request");
        let t3 = Table::build(table(&[(1, 20001, 100)]), &key, &t2);
        assert_eq!(t3.traffic()[0].leaving.len(), 1, "kept across pushes while the answer goes on");
        drop(lease);
        assert!(t3.traffic()[0].leaving.is_empty(), "reported only while a request is in flight");
        let back = Table::build(table(&[(1, 20001, 100), (2, 20002, 200)]), &key, &t3);
        assert!(back.leaving.is_empty(), "a copy named again is in the table, not leaving");
    }

    #[test]
    fn a_copy_taken_out_and_named_again_keeps_its_sessions_count() {
        let key = [1u8; 32];
        let t1 = Table::build(table(&[(1, 20001, 100)]), &key, &Table::default());
        t1.apps[0].copies[0].state.sessions.fetch_add(1, Ordering::Relaxed);
        t1.apps[0].copies[0].state.connections.fetch_add(1, Ordering::Relaxed);
        let empty = Table::build(table(&[]), &key, &t1);
        assert_eq!(empty.leaving.len(), 1);
        assert!(empty.traffic()[0].leaving.is_empty(), "a session is not a request the daemon waits for");
        let mut later = Table::build(table(&[]), &key, &empty);
        later.leaving.iter_mut().for_each(|l| l.left_ms = 0);
        let later = Table::build(table(&[]), &key, &later);
        assert_eq!(later.leaving.len(), 1, "kept past the linger while its session is open");
        let back = Table::build(table(&[(1, 20001, 100)]), &key, &later);
        assert_eq!(back.traffic()[0].copies[0].sessions, 1, "the open session is still counted");
        let other = Table::build(table(&[(1, 20001, 101)]), &key, &later);
        assert_eq!(other.traffic()[0].copies[0].sessions, 0, "another process is another copy");
    }

    #[test]
    fn an_app_being_deleted_is_not_listened_on_but_keeps_its_connections() {
        let key = [1u8; 32];
        let mut source = table(&[(1, 20001, 100)]);
        let mut newer = source.apps[0].clone();
        source.apps[0].listening = false;
        newer.name = "newer".into();
        source.apps.push(newer);
        let t = Table::build(source, &key, &Table::default());
        assert_eq!(t.listen_addrs().len(), 1);
        assert_eq!(t.app(8080).map(|a| a.name.as_str()), Some("newer"), "the port goes to the app listening on it");
        let mut alone = table(&[(1, 20001, 100)]);
        alone.apps[0].listening = false;
        let t = Table::build(alone, &key, &Table::default());
        assert!(t.listen_addrs().is_empty(), "no listener for an app being deleted");
        assert_eq!(t.app(8080).map(|a| a.name.as_str()), Some("hello"), "its open connections still find it");
        assert_eq!(t.traffic().len(), 1, "and its sessions are still counted");
    }

    #[test]
    fn holds_follow_the_docs_fifteen_seconds_for_a_copy_thirty_for_a_wake() {
        // README, "Staying up": "a request waits up to 15 seconds for the
        // app to come back"; README, "Sleep": a wake holds a request for the
        // app's request-timeout, 30 seconds at most. A request-timeout above 30 s
        // (as a table could carry) is still capped.
        let key = [1u8; 32];
        for (request_timeout, hold, wake_hold) in [(45, 15, 30), (30, 15, 30), (20, 15, 20), (3, 3, 3)] {
            let mut source = table(&[(1, 20001, 100)]);
            source.apps[0].route.request_timeout_ms = request_timeout * 1000;
            let t = Table::build(source, &key, &Table::default());
            assert_eq!(t.apps[0].hold, Duration::from_secs(hold), "request-timeout {request_timeout}s");
            assert_eq!(t.apps[0].wake_hold, Duration::from_secs(wake_hold), "request-timeout {request_timeout}s");
        }
    }

    #[test]
    fn the_sticky_cookie_must_be_signed_for_a_copy_in_the_table() {
        let key = [1u8; 32];
        let t = Table::build(table(&[(1, 20001, 100), (2, 20002, 200)]), &key, &Table::default());
        let app = &t.apps[0];
        let good = format!("x=1; lb_8080={}", cookie::sign(&key, 8080, 2));
        assert_eq!(app.sticky_copy(good.as_bytes()), Some(2));
        let stale = format!("lb_8080={}", cookie::sign(&key, 8080, 7));
        assert_eq!(app.sticky_copy(stale.as_bytes()), None);
        let other_port = format!("lb_8080={}", cookie::sign(&key, 9090, 2));
        assert_eq!(app.sticky_copy(other_port.as_bytes()), None);
        assert_eq!(app.sticky_copy(b"lb_8080=2.00"), None);
        let hdr = app.copies[1].set_cookie.to_str().unwrap().to_string();
        assert_eq!(hdr, format!("lb_8080={}; Path=/; HttpOnly; SameSite=Lax", cookie::sign(&key, 8080, 2)));
    }
}
