//! Bounds on what visitors can hold: the open-files limit raised at start,
//! the connection caps (the whole load balancer's, by its descriptors; each
//! app's `max-connections`; each visitor address's, sparing loopback and an
//! app's `trusted-proxies`), and the socket options that find dead or
//! stalled peers. The verdict on a new connection is pure ([`verdict`]); the
//! counts it reads live in [`CapCounters`].

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// The most connections one visitor address may hold open (loopback and
/// trusted proxies are not counted): a browser opens six, a busy office
/// behind one NAT address a few dozen.
pub const PER_ADDRESS_MAX: usize = 256;
/// Past a cap, this many more connections still get their 503 (with
/// Retry-After); beyond that a new connection is closed at once, as even a
/// 503 costs a descriptor and a buffer.
pub const SPARE: usize = 64;
/// Descriptors kept for everything but visitors' connections (listeners,
/// control socket, logs, the daemon link).
const FD_RESERVE: u64 = 64;
/// A connection with nothing to send is probed after this long idle...
pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(60);
/// ...every this long...
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// ...and dropped after this many probes go unanswered.
pub const KEEPALIVE_PROBES: u32 = 6;
/// Data we sent that the peer has not acknowledged (or a window it keeps
/// at zero: a visitor that reads nothing) for this long ends the
/// connection: responses are limited by progress, not by total time.
pub const STALL_LIMIT: Duration = Duration::from_secs(60);

/// Raises the soft limit on open files to the hard one; returns the soft
/// limit in force afterwards.
pub fn raise_open_files() -> io::Result<u64> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit only read and write the struct given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(io::Error::last_os_error());
        }
        lim.rlim_cur = lim.rlim_max;
    }
    Ok(lim.rlim_cur)
}

/// The soft limit on open files now.
pub fn open_files_limit() -> u64 {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit only writes the struct given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 1024;
    }
    lim.rlim_cur
}

/// How many visitors' connections fit in `nofile` descriptors: each may
/// need a second one to a copy, and some are kept for the rest.
pub fn connection_budget(nofile: u64) -> usize {
    (nofile.saturating_sub(FD_RESERVE) / 2).max(1) as usize
}

/// What a new visitor connection gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Served.
    Admit,
    /// Past a cap: each request gets a plain 503 with Retry-After, then the
    /// connection closes.
    Busy,
    /// Far past a cap: closed at once.
    Close,
}

/// The counts a verdict weighs, each the number open before this one.
#[derive(Debug, Clone, Copy)]
pub struct Counts {
    /// Visitors' connections open in the whole load balancer.
    pub total: usize,
    /// How many the descriptors allow ([`connection_budget`]).
    pub budget: usize,
    /// The app's admitted connections.
    pub app: usize,
    /// The app's `max-connections`.
    pub app_max: usize,
    /// This address's connections; `None` when it is exempt (loopback, a
    /// trusted proxy).
    pub address: Option<usize>,
}

/// The verdict on a new connection. Pure.
pub fn verdict(c: Counts) -> Verdict {
    let over = |open: usize, max: usize| {
        if open < max {
            None
        } else if open < max + SPARE {
            Some(Verdict::Busy)
        } else {
            Some(Verdict::Close)
        }
    };
    // The worst of the caps wins: the descriptors first, as running out of
    // them hurts every app.
    [over(c.total, c.budget), c.address.and_then(|a| over(a, PER_ADDRESS_MAX)), over(c.app, c.app_max)]
        .into_iter()
        .flatten()
        .max_by_key(|v| matches!(v, Verdict::Close))
        .unwrap_or(Verdict::Admit)
}

/// The counts behind the caps that span apps.
pub struct CapCounters {
    /// Visitors' connections open, admitted or being told 503.
    pub total: AtomicUsize,
    /// How many the descriptors allow.
    pub budget: usize,
    /// Open connections per visitor address (exempt ones are not kept).
    by_address: Mutex<HashMap<IpAddr, usize>>,
}

impl CapCounters {
    /// A gate for `budget` connections.
    pub fn new(budget: usize) -> CapCounters {
        CapCounters { total: AtomicUsize::new(0), budget, by_address: Mutex::new(HashMap::new()) }
    }

    /// Counts a connection from `ip` (None: exempt) and returns how many
    /// that address had open before it.
    pub fn enter(&self, ip: Option<IpAddr>) -> (usize, Option<usize>) {
        let total = self.total.fetch_add(1, Ordering::Relaxed);
        let address = ip.map(|ip| {
            let mut by = self.by_address.lock().unwrap_or_else(|e| e.into_inner());
            let n = by.entry(ip).or_insert(0);
            *n += 1;
            *n - 1
        });
        (total, address)
    }

    /// Uncounts a connection [`CapCounters::enter`] counted.
    pub fn leave(&self, ip: Option<IpAddr>) {
        self.total.fetch_sub(1, Ordering::Relaxed);
        if let Some(ip) = ip {
            let mut by = self.by_address.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(n) = by.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    by.remove(&ip);
                }
            }
        }
    }
}

/// Turns on TCP keepalive (dead peers of quiet connections, such as an idle
/// Shiny session, are found in about [`KEEPALIVE_IDLE`] plus a minute) and
/// the stall limit on a connection's socket.
pub fn watch_socket(stream: &tokio::net::TcpStream) {
    let sock = socket2::SockRef::from(stream);
    let keepalive = socket2::TcpKeepalive::new().with_time(KEEPALIVE_IDLE).with_interval(KEEPALIVE_INTERVAL).with_retries(KEEPALIVE_PROBES);
    if let Err(e) = sock.set_tcp_keepalive(&keepalive) {
        tracing::debug!("cannot set TCP keepalive: {e}");
    }
    if let Err(e) = sock.set_tcp_user_timeout(Some(STALL_LIMIT)) {
        tracing::debug!("cannot set TCP_USER_TIMEOUT: {e}");
    }
}

/// True for an error that is ours, not the copy's: the load balancer ran
/// out of descriptors, buffers, memory or local ports.
pub fn is_local(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM | libc::EADDRNOTAVAIL))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(total: usize, app: usize, address: Option<usize>) -> Counts {
        Counts { total, budget: 1000, app, app_max: 100, address }
    }

    #[test]
    fn each_cap_first_answers_503_then_closes() {
        assert_eq!(verdict(counts(0, 0, Some(0))), Verdict::Admit);
        assert_eq!(verdict(counts(500, 99, Some(PER_ADDRESS_MAX - 1))), Verdict::Admit);
        assert_eq!(verdict(counts(500, 100, Some(0))), Verdict::Busy, "the app's max-connections");
        assert_eq!(verdict(counts(500, 100 + SPARE, Some(0))), Verdict::Close);
        assert_eq!(verdict(counts(500, 0, Some(PER_ADDRESS_MAX))), Verdict::Busy, "one address");
        assert_eq!(verdict(counts(500, 0, Some(PER_ADDRESS_MAX + SPARE))), Verdict::Close);
        assert_eq!(verdict(counts(1000, 0, None)), Verdict::Busy, "the descriptors");
        assert_eq!(verdict(counts(1000 + SPARE, 0, None)), Verdict::Close);
        assert_eq!(verdict(counts(1000, 100 + SPARE, Some(0))), Verdict::Close, "the worst cap wins");
    }

    #[test]
    fn exempt_addresses_are_not_capped_per_address() {
        assert_eq!(verdict(counts(10, 0, None)), Verdict::Admit);
        let gate = CapCounters::new(10);
        let lo: IpAddr = "203.0.113.5".parse().unwrap();
        assert_eq!(gate.enter(Some(lo)), (0, Some(0)));
        assert_eq!(gate.enter(Some(lo)), (1, Some(1)));
        assert_eq!(gate.enter(None), (2, None));
        gate.leave(Some(lo));
        gate.leave(Some(lo));
        gate.leave(None);
        assert_eq!(gate.enter(Some(lo)), (0, Some(0)), "counts go back to nothing");
    }

    #[test]
    fn the_budget_leaves_room_for_a_copy_connection_each() {
        assert_eq!(connection_budget(1024), 480);
        assert_eq!(connection_budget(65536), 32736);
        assert_eq!(connection_budget(10), 1);
    }

    #[test]
    fn running_out_of_descriptors_is_local_and_a_refusal_is_not() {
        assert!(is_local(&io::Error::from_raw_os_error(libc::EMFILE)));
        assert!(is_local(&io::Error::from_raw_os_error(libc::ENOBUFS)));
        assert!(!is_local(&io::Error::from_raw_os_error(libc::ECONNREFUSED)));
        assert!(!is_local(&io::Error::new(io::ErrorKind::TimedOut, "connect timed out")));
    }
}
