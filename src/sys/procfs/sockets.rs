//! Listening TCP sockets and who holds them: the kernel's table (netlink,
//! else `/proc/net/tcp{,6}`) and each process's descriptors.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::str::FromStr;

use procfs::process::{FDTarget, Status};
use procfs::FromRead;

use super::{cmdline, descendants, env_var, parent_of, read};

/// A listening socket as `/proc/net/tcp{,6}` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listening {
    /// The socket's inode (what `/proc/<pid>/fd` links name).
    pub inode: u64,
    /// A connection to 127.0.0.1 on its port reaches it: it is bound to
    /// 127.0.0.1, 0.0.0.0 or `::` (or their IPv4-mapped forms).
    pub reaches_loopback: bool,
    /// The uid that made it (the table's `uid` column).
    pub uid: u32,
}

// /proc/net/tcp{,6} is parsed here, not by the crate's `TcpNetEntries`:
// the daemon reads both tables every cycle, and on a machine with many
// connections (the load balancer's) the crate, which decodes both addresses
// of every line, took 0.9 ms for 2,000 lines and 11 ms for 20,000 against
// 0.4 ms and 3.8 ms for this parser, which skips lines not in LISTEN first
// (measured side by side in a release build).

/// True when a local address of `/proc/net/tcp{,6}` (hex, as the kernel
/// writes it) is one a connection to 127.0.0.1 reaches.
fn reaches_loopback(hex_addr: &str) -> bool {
    const V4: [&str; 2] = ["0100007F", "00000000"];
    const V6: [&str; 3] = ["00000000000000000000000000000000", "0000000000000000FFFF00000100007F", "0000000000000000FFFF000000000000"];
    let a = hex_addr.to_ascii_uppercase();
    V4.contains(&a.as_str()) || V6.contains(&a.as_str())
}

/// The TCP sockets in LISTEN state (`st` 0A) on local port `port`, from
/// the text of `/proc/net/tcp` or `/proc/net/tcp6`, any local address.
#[cfg(test)]
fn parse_listening(table: &str, port: u16) -> Vec<Listening> {
    parse_all_listening(table).filter(|(p, _)| *p == port).map(|(_, l)| l).collect()
}

/// Every TCP socket in LISTEN state (`st` 0A) in the text of
/// `/proc/net/tcp` or `/proc/net/tcp6`, with its local port.
fn parse_all_listening(table: &str) -> impl Iterator<Item = (u16, Listening)> + '_ {
    table.lines().skip(1).filter_map(|line| {
        let f: Vec<&str> = line.split_ascii_whitespace().collect();
        // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
        if f.len() < 10 || f[3] != "0A" {
            return None;
        }
        let (hex_addr, hex_port) = f[1].rsplit_once(':')?;
        let port = u16::from_str_radix(hex_port, 16).ok()?;
        let inode = f[9].parse::<u64>().ok().filter(|&i| i != 0)?;
        let uid = f[7].parse::<u32>().ok()?;
        Some((port, Listening { inode, reaches_loopback: reaches_loopback(hex_addr), uid }))
    })
}

/// Every TCP socket listening on `port` (IPv4 and IPv6, any local
/// address), in the network namespace of this process. Several when, say,
/// one program listens on 127.0.0.1 and another on `::1`, or with
/// SO_REUSEPORT.
pub fn listening(port: u16) -> Vec<Listening> {
    read_listening(|p| p == port).remove(&port).unwrap_or_default()
}

/// The inodes of every TCP socket listening on `port`, any address.
pub fn listening_inodes(port: u16) -> Vec<u64> {
    listening(port).into_iter().map(|l| l.inode).collect()
}

/// The inode of a TCP socket listening on `port` (LISTEN, any local
/// address, IPv4 first then IPv6), or `None` when nobody listens there.
#[cfg(test)]
pub fn listening_inode(port: u16) -> Option<u64> {
    listening_inodes(port).into_iter().next()
}

/// The socket inodes among the open files of `pid` (`socket:[N]` links in
/// `/proc/<pid>/fd`). Empty when the process is gone or not ours to read.
/// The links are read here: the crate's `Process::fd` also `stat`s every
/// descriptor, which the daemon's check of every copy each cycle does not
/// need.
fn socket_inodes_of(pid: u32) -> HashSet<u64> {
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return HashSet::new();
    };
    dir.filter_map(|e| {
        let link = fs::read_link(e.ok()?.path()).ok()?;
        parse_socket_link(link.to_str()?)
    })
    .collect()
}

/// `socket:[123]` → 123.
fn parse_socket_link(link: &str) -> Option<u64> {
    match FDTarget::from_str(link).ok()? {
        FDTarget::Socket(inode) => Some(inode),
        _ => None,
    }
}

/// True when `pid` or one of its descendants has socket `inode` open
/// (an fd linking to `socket:[inode]`).
#[cfg(test)]
pub fn owns_socket(pid: u32, inode: u64) -> bool {
    descendants(pid).into_iter().any(|p| socket_inodes_of(p).contains(&inode))
}

/// Who listens on a port, as seen from a process tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortOwner {
    /// Every socket listening on the port belongs to the process tree.
    Ours,
    /// Some socket listening on the port belongs to another process.
    Other,
    /// Nobody listens on the port.
    Free,
}

/// Who listens on `port` where a connection to 127.0.0.1 arrives (a socket
/// bound to 127.0.0.1, 0.0.0.0 or `::`): the process tree of `pid`
/// ([`PortOwner::Ours`]), someone else ([`PortOwner::Other`]), or nobody
/// ([`PortOwner::Free`]; a socket on `::1` or another address alone is not
/// reached, so it does not count). When several such sockets listen, it is
/// `Ours` only if all of them are the tree's: a stranger sharing the port
/// could take the copy's connections.
pub fn port_owned_by(port: u16, pid: u32) -> PortOwner {
    owner_among(&listening(port), pid, None)
}

/// [`port_owned_by`] over sockets already read (`on_port`: those listening
/// on the port), looking at `hint` too before the whole tree: a process
/// known to hold the socket (R, under its launcher), taken only when it is
/// in `pid`'s tree. The full scan of /proc that finds the tree is the slow
/// part on a busy machine.
pub fn owner_among(on_port: &[Listening], pid: u32, hint: Option<u32>) -> PortOwner {
    let inodes: Vec<u64> = on_port.iter().filter(|l| l.reaches_loopback).map(|l| l.inode).collect();
    if inodes.is_empty() {
        return PortOwner::Free;
    }
    // The process itself first: the daemon checks every copy every cycle,
    // and R holds its own socket; its tree only when that is not enough.
    let mut own = socket_inodes_of(pid);
    if let Some(h) = hint.filter(|&h| h != pid && descends_from(h, pid)) {
        own.extend(socket_inodes_of(h));
    }
    if inodes.iter().all(|i| own.contains(i)) {
        return PortOwner::Ours;
    }
    let tree = descendants(pid);
    let ours: HashSet<u64> = tree.iter().copied().flat_map(socket_inodes_of).collect();
    // A process of the tree whose open files this user may not read runs as
    // an id of the copy's own (the app's subordinate uid, under a daemon
    // that is not root), which no process outside the app has: a socket it
    // made is the copy's.
    let hidden_uids: HashSet<u32> =
        tree.iter().filter(|p| fs::read_dir(format!("/proc/{p}/fd")).is_err()).filter_map(|&p| uid_of(p)).collect();
    let own_uid = nix::unistd::geteuid().as_raw();
    let theirs = |l: &Listening| ours.contains(&l.inode) || (l.uid != own_uid && hidden_uids.contains(&l.uid));
    if on_port.iter().filter(|l| l.reaches_loopback).all(theirs) {
        PortOwner::Ours
    } else {
        PortOwner::Other
    }
}

/// The real uid of a process (`/proc/<pid>/status`, readable by anyone).
fn uid_of(pid: u32) -> Option<u32> {
    Status::from_read(read(&format!("/proc/{pid}/status"))?.as_slice()).ok().map(|s| s.ruid)
}

/// True when `pid`'s parent, or its parent's parent, … (four levels at
/// most: a copy's launcher, its init, R) is `ancestor`.
fn descends_from(pid: u32, ancestor: u32) -> bool {
    let mut p = pid;
    for _ in 0..4 {
        match parent_of(p) {
            Some(parent) if parent == ancestor => return true,
            Some(parent) if parent > 1 => p = parent,
            _ => return false,
        }
    }
    false
}

/// Every TCP socket in LISTEN state on this machine's network namespace,
/// by port: one read of `/proc/net/tcp` and `/proc/net/tcp6` for many
/// ports.
pub fn listening_by_port() -> HashMap<u16, Vec<Listening>> {
    read_listening(|_| true)
}

/// The listening sockets on the ports `wanted` keeps, IPv4 then IPv6, each
/// socket once (a dual-stack one shows in both tables).
fn read_listening(wanted: impl Fn(u16) -> bool) -> HashMap<u16, Vec<Listening>> {
    let mut out: HashMap<u16, Vec<Listening>> = HashMap::new();
    let mut add = |port: u16, l: Listening| {
        let on = out.entry(port).or_default();
        if !on.iter().any(|o| o.inode == l.inode) {
            on.push(l);
        }
    };
    // Netlink first (`sys::sockdiag` says why); the files when it is refused.
    match crate::sys::sockdiag::listening_tcp() {
        Ok(sockets) => {
            for s in sockets.into_iter().filter(|s| wanted(s.port) && s.inode != 0) {
                add(s.port, Listening { inode: s.inode, reaches_loopback: addr_reaches_loopback(s.addr), uid: s.uid });
            }
        }
        Err(_) => {
            for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
                if let Ok(text) = fs::read_to_string(table) {
                    for (port, l) in parse_all_listening(&text).filter(|(p, _)| wanted(*p)) {
                        add(port, l);
                    }
                }
            }
        }
    }
    out
}

/// True when a connection to 127.0.0.1 reaches a socket bound to `addr`:
/// 127.0.0.1, 0.0.0.0, `::`, or their IPv4-mapped forms (as
/// [`reaches_loopback`] reads them from the files).
fn addr_reaches_loopback(addr: std::net::IpAddr) -> bool {
    use std::net::{IpAddr, Ipv4Addr};
    let v4 = match addr {
        IpAddr::V4(a) => a,
        IpAddr::V6(a) if a.is_unspecified() => return true,
        IpAddr::V6(a) => match a.to_ipv4_mapped() {
            Some(a) => a,
            None => return false,
        },
    };
    v4 == Ipv4Addr::LOCALHOST || v4.is_unspecified()
}

/// A process that holds a socket listening on a port, as /proc shows it
/// to this user (its own processes; root sees all).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// Its PID.
    pub pid: u32,
    /// Its command line, arguments joined by blanks.
    pub cmdline: String,
    /// `SHINYCTL_HOME` in its environment, when it has one (a shinyctl
    /// process of some home).
    pub shinyctl_home: Option<String>,
}

/// The processes that hold a socket listening on `port` (any address),
/// among those whose open files this process may read. Empty when nobody
/// listens or only processes of other users do.
pub fn port_holders(port: u16) -> Vec<Holder> {
    let inodes: HashSet<u64> = listening_inodes(port).into_iter().collect();
    if inodes.is_empty() {
        return Vec::new();
    }
    let Ok(dir) = fs::read_dir("/proc") else { return Vec::new() };
    let mut out: Vec<Holder> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| socket_inodes_of(pid).iter().any(|i| inodes.contains(i)))
        .map(|pid| Holder { pid, cmdline: cmdline(pid), shinyctl_home: env_var(pid, "SHINYCTL_HOME") })
        .collect();
    out.sort_by_key(|h| h.pid);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn listening_table_parsing() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 4242 1 0000000000000000 100 0 0 10 0\n   1: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000  1000        0 4343 1 0000000000000000 20 4 30 10 -1\n   2: 00000000:0050 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 99 1 0000000000000000 100 0 0 10 0\n";
        let inodes = |port| parse_listening(table, port).into_iter().map(|l| l.inode).collect::<Vec<_>>();
        assert_eq!(inodes(8080), vec![4242]);
        assert_eq!(inodes(80), vec![99]);
        assert!(parse_listening(table, 80)[0].reaches_loopback, "0.0.0.0 is reached from 127.0.0.1");
        assert!(parse_listening(table, 81).is_empty());
        assert_eq!(parse_socket_link("socket:[4242]"), Some(4242));
        assert_eq!(parse_socket_link("pipe:[4242]"), None);
    }

    #[test]
    fn own_listener_is_found_and_ours() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let me = std::process::id();
        let inode = listening_inode(port).expect("the test's listener is in /proc/net/tcp");
        assert!(owns_socket(me, inode));
        assert_eq!(port_owned_by(port, me), PortOwner::Ours);
        // A child holds no descriptor of the socket (std opens with
        // CLOEXEC), so it does not own it.
        let mut child = std::process::Command::new("sleep").arg("5").spawn().unwrap();
        assert!(!owns_socket(child.id(), inode));
        child.kill().unwrap();
        child.wait().unwrap();
        drop(l);
        // A port just freed (nobody else should grab it this instant). A
        // child another test forks at this moment holds the socket until it
        // execs, so the port is free within a deadline, not at once.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while listening_inode(port).is_some() {
            assert!(std::time::Instant::now() < deadline, "port {port} still listening after it was closed");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(port_owned_by(port, me), PortOwner::Free);
    }

    #[test]
    fn own_ipv6_listener_is_found_and_counts_only_where_127_0_0_1_reaches() {
        let l = TcpListener::bind("[::1]:0").expect("an IPv6 loopback to listen on");
        let port = l.local_addr().unwrap().port();
        assert!(listening_inode(port).is_some());
        assert_eq!(port_owned_by(port, std::process::id()), PortOwner::Free, "127.0.0.1 does not reach ::1");
        let any = TcpListener::bind("[::]:0").expect("IPv6 any");
        let port = any.local_addr().unwrap().port();
        assert_eq!(port_owned_by(port, std::process::id()), PortOwner::Ours, ":: is reached");
        let holders = port_holders(port);
        assert!(holders.iter().any(|h| h.pid == std::process::id()), "{holders:?}");
    }

    #[test]
    fn which_addresses_127_0_0_1_reaches() {
        assert!(reaches_loopback("0100007F") && reaches_loopback("00000000"));
        assert!(!reaches_loopback("0200007F"), "127.0.0.2 is another address");
        assert!(reaches_loopback("00000000000000000000000000000000"));
        assert!(reaches_loopback("0000000000000000ffff00000100007f"));
        assert!(!reaches_loopback("00000000000000000000000001000000"), "::1 is not reached");
    }

    #[test]
    fn listener_of_this_process_is_other_for_a_child() {
        // A child `sleep` is not in the tree that owns this process's socket
        // (its tree is itself), so for it the port is someone else's.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let mut child = std::process::Command::new("sleep").arg("5").spawn().unwrap();
        // The child inherits no fds from Rust's std (CLOEXEC), so it owns nothing.
        assert_eq!(port_owned_by(port, child.id()), PortOwner::Other);
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn an_address_reaches_loopback_as_its_hex_form_does() {
        let cases = [
            ("127.0.0.1", "0100007F", true),
            ("0.0.0.0", "00000000", true),
            ("127.0.0.2", "0200007F", false),
            ("192.0.2.1", "010200C0", false),
            ("::", "00000000000000000000000000000000", true),
            ("::ffff:127.0.0.1", "0000000000000000FFFF00000100007F", true),
            ("::ffff:0.0.0.0", "0000000000000000FFFF000000000000", true),
            ("::1", "00000000000000000000000001000000", false),
        ];
        for (addr, hex, reaches) in cases {
            assert_eq!(addr_reaches_loopback(addr.parse().unwrap()), reaches, "{addr}");
            assert_eq!(reaches_loopback(hex), reaches, "{hex}");
        }
    }
}
