//! The apps' listening sockets, which the daemon holds (the pattern of
//! systemd's socket activation). Each is bound once, at `apply` (so the
//! bind itself is the check that the port can be had), with SO_REUSEADDR
//! and not SO_REUSEPORT (so no other program or shinyctl home can share
//! it), and given to each load balancer the daemon starts, over
//! `handover.sock`. While a load balancer is dead they stay open here, so
//! connections wait in the kernel's accept queue for the next one. A daemon
//! that starts asks the running load balancer for them back. Like every
//! socket std and socket2 open, they are CLOEXEC: no copy inherits one.

use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::os::fd::{AsRawFd, RawFd};

use socket2::{Domain, Protocol, Socket, Type};

use crate::sys::procfs;

/// Accept queue length of each listening socket: what waits while no load
/// balancer accepts.
const BACKLOG: i32 = 1024;

/// The address an app listens on, as the table names it: (host, port).
pub type Addr = (String, u16);

/// The listening sockets the daemon holds.
#[derive(Default)]
pub struct HeldSockets {
    /// The sockets, by the host and port of the app that listens there.
    sockets: HashMap<Addr, TcpListener>,
    /// Why a port an app names has no socket, by port (a daemon that found
    /// the port taken or not permitted when it started): a line in status.
    failed: HashMap<u16, String>,
    /// The load balancer that has the set, and the set it has.
    given: Option<(u32, Vec<Addr>)>,
}

impl HeldSockets {
    /// Starts with the sockets a running load balancer handed back.
    pub fn adopt(sockets: HashMap<Addr, TcpListener>) -> HeldSockets {
        HeldSockets { sockets, ..Default::default() }
    }

    /// True when the socket for `addr` is held.
    pub fn holds(&self, addr: &Addr) -> bool {
        self.sockets.contains_key(addr)
    }

    /// Keeps a socket bound for an app (at apply).
    pub fn insert(&mut self, addr: Addr, socket: TcpListener) {
        self.failed.remove(&addr.1);
        self.sockets.entry(addr).or_insert(socket);
    }

    /// True when some port an app names has no socket.
    pub fn has_failures(&self) -> bool {
        !self.failed.is_empty()
    }

    /// Why `port` is not listened on, if it is not.
    pub fn failure(&self, port: u16) -> Option<&str> {
        self.failed.get(&port).map(String::as_str)
    }

    /// Makes the sockets held match the addresses the apps listen on:
    /// closes the others (a deleted app, a port or host changed) and binds
    /// the missing ones, noting why one cannot be. Returns true when the
    /// set changed.
    pub fn sync(&mut self, wanted: &[Addr]) -> bool {
        let before = self.sockets.len();
        self.sockets.retain(|addr, _| wanted.contains(addr));
        let mut changed = self.sockets.len() != before;
        self.failed.retain(|port, _| wanted.iter().any(|(_, p)| p == port));
        for addr in wanted {
            if self.sockets.contains_key(addr) {
                continue;
            }
            match bind(&addr.0, addr.1) {
                Ok(socket) => {
                    tracing::info!(port = addr.1, host = %addr.0, "holding the listening socket of {}:{}", addr.0, addr.1);
                    self.failed.remove(&addr.1);
                    self.sockets.insert(addr.clone(), socket);
                    changed = true;
                }
                Err(e) => {
                    let why = short_reason(&e);
                    if self.failed.get(&addr.1) != Some(&why) {
                        tracing::error!(port = addr.1, host = %addr.0, "cannot listen on {}:{}: {}", addr.0, addr.1, explain(&addr.0, addr.1, &e));
                    }
                    self.failed.insert(addr.1, why);
                }
            }
        }
        changed
    }

    /// The set to give the load balancer `pid` when it does not have it
    /// yet: each socket duplicated, so it can be sent off the daemon's lock.
    pub fn to_give(&self, pid: Option<u32>) -> Option<(u32, Vec<(Addr, TcpListener)>)> {
        let pid = pid?;
        let mut addrs: Vec<Addr> = self.sockets.keys().cloned().collect();
        addrs.sort();
        if self.given.as_ref() == Some(&(pid, addrs.clone())) {
            return None;
        }
        let dups = addrs.into_iter().filter_map(|a| Some((a.clone(), self.sockets.get(&a)?.try_clone().ok()?))).collect();
        Some((pid, dups))
    }

    /// Notes that the load balancer `pid` took the set `addrs`.
    pub fn given(&mut self, pid: u32, mut addrs: Vec<Addr>) {
        addrs.sort();
        self.given = Some((pid, addrs));
    }

    /// True when the load balancer `pid` has the set held now.
    pub fn has_been_given(&self, pid: Option<u32>) -> bool {
        self.to_give(pid).is_none() && pid.is_some()
    }
}

/// Sends `set` to the load balancer on `path`; returns the PID that took it.
pub fn give(path: &std::path::Path, set: &[(Addr, TcpListener)]) -> io::Result<u32> {
    let held: Vec<(String, u16, RawFd)> = set.iter().map(|((h, p), s)| (h.clone(), *p, s.as_raw_fd())).collect();
    crate::wire::handover::give(path, &held)
}

/// The socket address `host` names (`*` and empty are every address).
fn resolve(host: &str, port: u16) -> io::Result<SocketAddr> {
    let host = match host.trim_start_matches('[').trim_end_matches(']') {
        "" | "*" => "0.0.0.0",
        h => h,
    };
    (host, port).to_socket_addrs()?.next().ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("{host} has no address")))
}

/// A listening socket on `host:port`: SO_REUSEADDR (a port left in
/// TIME_WAIT by the last one can be bound again), never SO_REUSEPORT (a
/// port another program holds is refused, not shared), CLOEXEC.
pub fn bind(host: &str, port: u16) -> io::Result<TcpListener> {
    let addr = resolve(host, port).map_err(|e| io::Error::new(io::ErrorKind::NotFound, format!("{host} does not resolve: {e}")))?;
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM.cloexec(), Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    Ok(socket.into())
}

/// A few words for the line under the status table: `permission denied`.
fn short_reason(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::EACCES) | Some(libc::EPERM) => "permission denied".into(),
        Some(libc::EADDRINUSE) => "another program listens on it".into(),
        Some(libc::EADDRNOTAVAIL) => "the address is not on this machine".into(),
        _ => e.to_string(),
    }
}

/// Why `host:port` cannot be listened on and what to do instead, for a
/// person: who holds a port in use, the sysctl and the capability for a
/// low port, the addresses for one not on this machine.
pub fn explain(host: &str, port: u16, e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::EADDRINUSE) => in_use(port, &procfs::port_holders(port), nix::unistd::geteuid().is_root()),
        Some(libc::EACCES) | Some(libc::EPERM) => low_port(port),
        Some(libc::EADDRNOTAVAIL) => format!(
            "host {host} is not an address of this machine, so nothing can listen on {host}:{port}. \
             Use 0.0.0.0 (every address), 127.0.0.1 (this machine only), or an address that `ip -brief address` lists"
        ),
        _ => format!("cannot listen on {host}:{port}: {e}"),
    }
}

/// What a shinyctl process is, from its command line.
fn shinyctl_role(cmdline: &str) -> Option<&'static str> {
    let first = cmdline.split(' ').next().unwrap_or_default();
    if !(first == "shinyctl" || first.ends_with("/shinyctl")) {
        return None;
    }
    if cmdline.ends_with(" proxy") {
        Some("load balancer")
    } else if cmdline.ends_with(" serve") {
        Some("daemon")
    } else {
        None
    }
}

/// Port `port` is in use by `holders` (as far as /proc lets this user see;
/// `root` sees every process):
/// another shinyctl home by its SHINYCTL_HOME, its load balancer first,
/// or each other program by PID and command line.
fn in_use(port: u16, holders: &[procfs::Holder], root: bool) -> String {
    if holders.is_empty() && root {
        return format!(
            "port {port} is already in use (`ss -ltnp 'sport = :{port}'` names what holds it). Pick another port, or stop that program"
        );
    }
    if holders.is_empty() {
        return format!(
            "port {port} is already in use by a process of another user, which this user cannot see \
             (`sudo ss -ltnp 'sport = :{port}'` names it). Pick another port, or stop that program"
        );
    }
    let mut homes: Vec<(String, Vec<String>)> = Vec::new();
    let mut others = Vec::new();
    let mut sorted: Vec<&procfs::Holder> = holders.iter().collect();
    sorted.sort_by_key(|h| shinyctl_role(&h.cmdline) != Some("load balancer"));
    for h in sorted {
        match shinyctl_role(&h.cmdline) {
            Some(role) => {
                let home = h.shinyctl_home.clone().unwrap_or_else(|| "~/.shinyctl of its user".into());
                let what = format!("its {role} (pid {}, {})", h.pid, h.cmdline);
                match homes.iter_mut().find(|(x, _)| *x == home) {
                    Some((_, list)) => list.push(what),
                    None => homes.push((home, vec![what])),
                }
            }
            None => others.push(format!("pid {} ({})", h.pid, h.cmdline)),
        }
    }
    let mut parts: Vec<String> = homes
        .iter()
        .map(|(home, list)| format!("another shinyctl home, SHINYCTL_HOME={home}, listens on it: {}", list.join(" and ")))
        .collect();
    if !others.is_empty() {
        parts.push(format!("{} listens on it", others.join(", ")));
    }
    let advice = match homes.first() {
        Some((home, _)) => {
            format!("Pick another port, or remove the app that has it there (`SHINYCTL_HOME={home} shinyctl status` lists it)")
        }
        None => "Pick another port, or stop that program".into(),
    };
    format!("port {port} is already in use: {}. {advice}", parts.join("; "))
}

/// What to do about a port below `net.ipv4.ip_unprivileged_port_start`.
fn low_port(port: u16) -> String {
    let start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_unprivileged_port_start")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .unwrap_or(1024);
    let user = nix::unistd::User::from_uid(nix::unistd::getuid()).ok().flatten().map(|u| u.name).unwrap_or_else(|| "this user".into());
    let exe = std::env::current_exe().map(|p| p.display().to_string()).unwrap_or_else(|_| "shinyctl".into());
    format!(
        "port {port} is below {start} (net.ipv4.ip_unprivileged_port_start), where only a process with \
         CAP_NET_BIND_SERVICE may listen, and shinyctl serve runs as {user} without it. Either use a port of 1024 or \
         more (say 8080) behind a front proxy (Caddy, nginx) that listens on {port}; or let every user listen from \
         {port} up: `sudo sysctl net.ipv4.ip_unprivileged_port_start={port}` (and a file in /etc/sysctl.d/ to keep it); \
         or give shinyctl the capability: `sudo setcap cap_net_bind_service=+ep {exe}`, then restart shinyctl serve"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_held_is_refused_to_another_bind_and_names_its_holder() {
        let held = bind("127.0.0.1", 0).unwrap();
        let port = held.local_addr().unwrap().port();
        let e = bind("127.0.0.1", port).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EADDRINUSE), "no SO_REUSEPORT: not shared");
        let text = explain("127.0.0.1", port, &e);
        assert!(text.contains(&format!("pid {}", std::process::id())), "{text}");
        let flags = nix::fcntl::fcntl(held.as_raw_fd(), nix::fcntl::FcntlArg::F_GETFD).unwrap();
        assert!(flags & libc::FD_CLOEXEC != 0, "kept out of every child");
    }

    #[test]
    fn sync_binds_what_apps_name_and_closes_the_rest() {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut held = HeldSockets::default();
        let addr = ("127.0.0.1".to_string(), port);
        assert!(held.sync(std::slice::from_ref(&addr)));
        assert!(held.holds(&addr));
        let (pid, set) = held.to_give(Some(7)).expect("a new set to give");
        held.given(pid, set.into_iter().map(|(a, _)| a).collect());
        assert!(held.has_been_given(Some(7)) && !held.has_been_given(Some(8)));
        assert!(held.sync(&[]), "closed");
        assert!(bind("127.0.0.1", port).is_ok(), "the port is free again");
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let busy = ("127.0.0.1".to_string(), taken.local_addr().unwrap().port());
        assert!(!held.sync(std::slice::from_ref(&busy)));
        assert_eq!(held.failure(busy.1), Some("another program listens on it"));
    }

    #[test]
    fn another_home_is_named_by_its_home_with_its_load_balancer_first() {
        let h = |pid, cmdline: &str, home: Option<&str>| procfs::Holder {
            pid,
            cmdline: cmdline.into(),
            shinyctl_home: home.map(str::to_string),
        };
        let text = in_use(
            8080,
            &[
                h(10, "/usr/bin/shinyctl serve", Some("/srv/a")),
                h(11, "/usr/bin/shinyctl proxy", Some("/srv/a")),
                h(12, "nginx: master", None),
            ],
            false,
        );
        assert_eq!(
            text,
            "port 8080 is already in use: another shinyctl home, SHINYCTL_HOME=/srv/a, listens on it: its load balancer \
             (pid 11, /usr/bin/shinyctl proxy) and its daemon (pid 10, /usr/bin/shinyctl serve); pid 12 (nginx: master) \
             listens on it. Pick another port, or remove the app that has it there (`SHINYCTL_HOME=/srv/a shinyctl status` lists it)"
        );
        assert!(in_use(8080, &[], false).contains("another user"));
        // Root sees every process: none found is no other user's.
        assert!(!in_use(8080, &[], true).contains("another user"));
    }

    #[test]
    fn an_address_not_on_this_machine_says_so() {
        // TEST-NET-1 (RFC 5737) is on no machine.
        let e = bind("192.0.2.1", 0).unwrap_err();
        let text = explain("192.0.2.1", 8080, &e);
        assert!(text.contains("not an address of this machine"), "{text}");
        assert!(low_port(80).contains("net.ipv4.ip_unprivileged_port_start"));
    }
}
