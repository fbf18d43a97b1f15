//! Reading /proc: process liveness, start times, memory, socket ownership,
//! mounts.
//!
//! Every function reads the live system and never panics: a process that is
//! gone (or a file that can't be read) gives `None`, `false`, an empty list
//! or [`PortOwner::Free`]. The `procfs` crate parses `statm`, `status`,
//! descriptor links and `mountinfo` from their text (a pure step, tested on
//! its own); `stat` and `/proc/net/tcp{,6}`, read for every process and
//! socket each cycle, keep parsers of their own, which measured faster
//! (the comments at each say by how much). The files are opened here, by
//! path: the crate's own readers open each process's folder first
//! (`Process::new`) and `stat` each descriptor, more system calls on the
//! scans the daemon makes every cycle.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::str::FromStr;

use procfs::process::{FDTarget, MountInfo, SmapsRollup, StatM, Status};
use procfs::FromRead;

/// The text of a /proc file, read with one open and read: the scans of
/// every process each cycle read thousands of these, and the crate's
/// `Process::new(pid)` would first open and `fstat` the process's folder.
fn read(path: &str) -> Option<Vec<u8>> {
    fs::read(path).ok()
}

// ---------------------------------------------------------------------------
// /proc/<pid>/stat
// ---------------------------------------------------------------------------

// Parsed here, not by the crate's `Stat`: the daemon reads every
// process's stat each cycle (process trees), and the crate's parser, which
// reads all 52 fields, took 1.06 µs a file against 0.31 µs for this one
// (reading the file takes 4.2 µs), measured side by side in a release
// build.

/// The fields of `/proc/<pid>/stat` after the command name, split on
/// blanks: index 0 is field 3 (state), index 1 field 4 (ppid), index 19
/// field 22 (starttime). The command name, in parentheses, may itself hold
/// blanks and parentheses, so the split starts after the *last* `)`.
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    let close = stat.rfind(')')?;
    Some(stat[close + 1..].split_ascii_whitespace().collect())
}

/// State (field 3), ppid (field 4) and start ticks (field 22) from the text
/// of a `/proc/<pid>/stat` file.
fn parse_stat(stat: &str) -> Option<(char, u32, u64)> {
    let f = stat_fields(stat)?;
    let state = f.first()?.chars().next()?;
    let ppid = f.get(1)?.parse().ok()?;
    let start = f.get(19)?.parse().ok()?;
    Some((state, ppid, start))
}

/// CPU time in clock ticks from the text of a `/proc/<pid>/stat` file:
/// utime + stime (fields 14 and 15), plus cutime + cstime (16 and 17), the
/// time of children it has waited for, so a tree's sum does not drop when
/// a child ends.
fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let f = stat_fields(stat)?;
    (11..15).map(|i| f.get(i)?.parse::<u64>().ok()).sum()
}

/// The clock ticks per second that /proc counts CPU time in.
fn ticks_per_sec() -> u64 {
    procfs::ticks_per_second().max(1)
}

/// The CPU time one process has used (its own and that of the children
/// it waited for), in clock ticks; `None` when there is no such process.
fn cpu_ticks(pid: u32) -> Option<u64> {
    parse_cpu_ticks(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// State, ppid and start ticks of process `pid`.
fn read_stat(pid: u32) -> Option<(char, u32, u64)> {
    parse_stat(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// The process's start time in clock ticks since boot: field 22 of
/// `/proc/<pid>/stat`. With the PID, it names a process for good: a reused
/// PID has another start time. `None` when there is no such process.
pub fn start_ticks(pid: u32) -> Option<u64> {
    read_stat(pid).map(|(_, _, start)| start)
}

/// True when process `pid` exists, started at `start_ticks` (so it is the
/// same process, not a reused PID), and is neither a zombie (`Z`) nor dead
/// (`X`/`x`).
pub fn is_alive(pid: u32, start_ticks: u64) -> bool {
    match read_stat(pid) {
        Some((state, _, start)) => start == start_ticks && !matches!(state, 'Z' | 'X' | 'x'),
        None => false,
    }
}

/// True while a process with this PID exists and is not a zombie.
pub fn running(pid: u32) -> bool {
    read_stat(pid).is_some_and(|(state, _, _)| !matches!(state, 'Z' | 'X' | 'x'))
}

/// The kernel's flag on a task that has begun to exit (`PF_EXITING`, in
/// the flags field of `/proc/<pid>/stat`).
const PF_EXITING: u32 = 0x4;

/// True when process `pid` is on its way out: its main thread has begun
/// to exit, or has a SIGKILL pending. A process killed by a signal or
/// calling `exit` ends each thread with a SIGKILL the kernel sends it, so
/// one of the two holds from the moment the end begins; a thread that
/// ends on its own (`pthread_exit`) leaves neither on the main thread.
pub fn is_ending(pid: u32) -> bool {
    use procfs::process::Stat;
    const SIGKILL_BIT: u64 = 1 << (libc::SIGKILL - 1);
    let exiting = read(&format!("/proc/{pid}/stat")).and_then(|b| Stat::from_read(&b[..]).ok()).is_none_or(|s| s.flags & PF_EXITING != 0);
    exiting
        || read(&format!("/proc/{pid}/status"))
            .and_then(|b| Status::from_read(&b[..]).ok())
            .is_none_or(|s| (s.sigpnd | s.shdpnd) & SIGKILL_BIT != 0)
}

/// The threads of process `pid` other than its main one.
pub fn other_threads(pid: u32) -> Vec<u32> {
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).filter(|&tid| tid != pid).collect()
}

/// The parent of process `pid`.
pub fn parent_of(pid: u32) -> Option<u32> {
    read_stat(pid).map(|(_, ppid, start)| adopter(pid, start).unwrap_or(ppid))
}

/// Claimed copies' forks of the pool's zygote, each with its start time
/// and the launcher that claimed it: the fork is a child of the zygote,
/// but its processes are the launcher's copy's (its report says so,
/// `wire::launch::report::read_report`), for readiness, memory and CPU alike.
fn adopted() -> &'static std::sync::Mutex<HashMap<u32, (u64, u32)>> {
    static ADOPTED: std::sync::OnceLock<std::sync::Mutex<HashMap<u32, (u64, u32)>>> = std::sync::OnceLock::new();
    ADOPTED.get_or_init(Default::default)
}

/// Counts the process `fork` (a claimed copy's fork of the zygote) as a
/// child of `launcher` from now on, while it is the process it is now.
pub fn adopt(fork: u32, launcher: u32) {
    let Some(start) = start_ticks(fork) else { return };
    let mut map = adopted().lock().unwrap_or_else(|e| e.into_inner());
    // Forks that are gone are forgotten.
    map.retain(|&pid, &mut (s, _)| start_ticks(pid) == Some(s));
    map.insert(fork, (start, launcher));
}

/// The launcher that adopted `pid` (started at `start`), if one did.
fn adopter(pid: u32, start: u64) -> Option<u32> {
    let map = adopted().lock().unwrap_or_else(|e| e.into_inner());
    map.get(&pid).filter(|(s, _)| *s == start).map(|&(_, l)| l)
}

/// Every process as (pid, ppid), from `/proc/*/stat`.
fn all_parents() -> Vec<(u32, u32)> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let pid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let (_, ppid, start) = read_stat(pid)?;
        Some((pid, adopter(pid, start).unwrap_or(ppid)))
    })
    .collect()
}

/// `root` and every descendant of it in a (pid, ppid) list, root first,
/// then breadth first. Pure; cycles can't loop it.
fn descendants_in(root: u32, procs: &[(u32, u32)]) -> Vec<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for &(pid, ppid) in procs {
        if pid != ppid {
            children.entry(ppid).or_default().push(pid);
        }
    }
    let mut out = vec![root];
    let mut seen: HashSet<u32> = HashSet::from([root]);
    let mut i = 0;
    while i < out.len() {
        if let Some(kids) = children.get(&out[i]) {
            for &k in kids {
                if seen.insert(k) {
                    out.push(k);
                }
            }
        }
        i += 1;
    }
    out
}

/// `pid` and all its descendants (children, their children, …), `pid`
/// first, found by scanning the ppid of every `/proc/*/stat`. Empty when
/// `pid` does not exist. A process that double-forked away (reparented to
/// init) is no longer a descendant.
pub fn descendants(pid: u32) -> Vec<u32> {
    if read_stat(pid).is_none() {
        return Vec::new();
    }
    descendants_in(pid, &all_parents())
}

// ---------------------------------------------------------------------------
// Memory
// ---------------------------------------------------------------------------

/// Resident pages (field 2) from the text of `/proc/<pid>/statm`.
fn parse_statm_resident(statm: &[u8]) -> Option<u64> {
    StatM::from_read(statm).ok().map(|m| m.resident)
}

/// The resident memory of one process, in bytes (`/proc/<pid>/statm`
/// resident pages × page size). `None` when there is no such process.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    Some(parse_statm_resident(&read(&format!("/proc/{pid}/statm"))?)? * procfs::page_size())
}

/// The proportional set size (`Pss` of `/proc/<pid>/smaps_rollup`) from
/// its text, in bytes: each resident page divided by the number of
/// processes that map it.
fn parse_pss(rollup: &[u8]) -> Option<u64> {
    let rollup = SmapsRollup::from_read(rollup).ok()?;
    rollup.memory_map_rollup.0.first()?.extension.map.get("Pss").copied()
}

/// What one process's memory costs the machine, in bytes: its proportional
/// set size, where the pages it shares with other processes (a claimed
/// copy's with the pool's zygote, R's libraries with every R) count for
/// their share only, so a sum over processes is what they use together.
/// Its resident memory where `smaps_rollup` cannot be read (an older kernel,
/// a process whose memory another user may not look at). `None` when there
/// is no such process. About 1 ms for an R process (the kernel walks its
/// page tables), against 0.02 for the resident memory: read off the lock,
/// every few seconds.
pub fn mem_bytes(pid: u32) -> Option<u64> {
    read(&format!("/proc/{pid}/smaps_rollup")).and_then(|r| parse_pss(&r)).or_else(|| rss_bytes(pid))
}

/// The resident memory of `pid` and all its descendants, summed, in bytes.
/// `None` when `pid` does not exist. Pages shared between the processes are
/// counted once per process, as `ps` and `top` do.
pub fn tree_rss_bytes(pid: u32) -> Option<u64> {
    Processes::read().tree_rss_bytes(pid)
}

/// Every process's parent, read once (a scan of every `/proc/*/stat`) for
/// many lookups of process trees: `status` with many copies, the memory
/// watch's round.
pub struct Processes(Vec<(u32, u32)>);

impl Processes {
    /// Reads every process's parent now.
    pub fn read() -> Processes {
        Processes(all_parents())
    }

    /// [`tree_rss_bytes`], for the tree as this snapshot saw it (a process
    /// started since is not counted). `None` when `pid` is gone.
    pub fn tree_rss_bytes(&self, pid: u32) -> Option<u64> {
        self.tree_sum(pid, rss_bytes)
    }

    /// `figure` of `pid` and of each of its descendants that still has one,
    /// summed; `None` when `pid` has none (it is gone).
    fn tree_sum(&self, pid: u32, figure: impl Fn(u32) -> Option<u64>) -> Option<u64> {
        let own = figure(pid)?;
        Some(own + descendants_in(pid, &self.0).iter().skip(1).filter_map(|&p| figure(p)).sum::<u64>())
    }

    /// [`mem_bytes`] of `pid` and its descendants as this snapshot saw them,
    /// summed (what status shows as a copy's MEM, what its memory limit
    /// outside a cgroup and the memory bound on growth count). `None` when
    /// `pid` is gone.
    pub fn tree_mem_bytes(&self, pid: u32) -> Option<u64> {
        self.tree_sum(pid, mem_bytes)
    }
}

impl Processes {
    /// The CPU time, in seconds, of `pid` and all its descendants as this
    /// snapshot saw them (what `status --wide` shows as a copy's CPU time).
    /// `None` when `pid` is gone.
    pub fn tree_cpu_secs(&self, pid: u32) -> Option<f64> {
        Some(self.tree_sum(pid, cpu_ticks)? as f64 / ticks_per_sec() as f64)
    }
}

// ---------------------------------------------------------------------------
// Sockets
// ---------------------------------------------------------------------------

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

/// The command line of a process, arguments joined by blanks.
pub fn cmdline(pid: u32) -> String {
    fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).split('\0').filter(|s| !s.is_empty()).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// One variable of a process's environment, when readable.
fn env_var(pid: u32, name: &str) -> Option<String> {
    let env = fs::read(format!("/proc/{pid}/environ")).ok()?;
    let prefix = format!("{name}=");
    env.split(|b| *b == 0).find_map(|kv| kv.strip_prefix(prefix.as_bytes()).map(|v| String::from_utf8_lossy(v).into_owned()))
}

// ---------------------------------------------------------------------------
// Mounts
// ---------------------------------------------------------------------------

/// A mount as `/proc/self/mountinfo` shows it, its paths with the kernel's
/// octal escapes undone (a blank is written `\040`, a tab `\011`, a
/// backslash `\134`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// The path inside its filesystem that shows at the mount point (`/`
    /// mostly; a cgroup's path for a cgroup mount).
    pub root: PathBuf,
    /// Where it is mounted.
    pub point: PathBuf,
    /// Its filesystem type (`cgroup2`, `ext4`, …).
    pub fs_type: String,
    /// Its super options by name (for cgroup v1, the controllers such as
    /// `memory`), in no order.
    pub super_options: Vec<String>,
}

/// The mounts in the text of a `mountinfo` file; a line the crate cannot
/// read is left out.
pub fn parse_mountinfo(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|l| MountInfo::from_line(l).ok())
        .map(|m| Mount {
            root: unescape(m.root.as_bytes()),
            point: unescape(m.mount_point.as_os_str().as_bytes()),
            fs_type: m.fs_type,
            super_options: m.super_options.into_keys().collect(),
        })
        .collect()
}

/// This process's mounts (`/proc/self/mountinfo`); none when it can't be
/// read.
pub fn mounts() -> Vec<Mount> {
    parse_mountinfo(&fs::read_to_string("/proc/self/mountinfo").unwrap_or_default())
}

/// A mountinfo field with its `\040`-style escapes undone (the crate keeps
/// them).
fn unescape(field: &[u8]) -> PathBuf {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let octal = field.get(i + 1..i + 4).filter(|d| field[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                out.push(d.iter().fold(0u8, |n, c| n.wrapping_mul(8).wrapping_add(c - b'0')));
                i += 4;
            }
            None => {
                out.push(field[i]);
                i += 1;
            }
        }
    }
    PathBuf::from(std::ffi::OsStr::from_bytes(&out))
}

// ---------------------------------------------------------------------------
// Times (in `crate::sys::fmt`; named here too for the daemon's callers)
// ---------------------------------------------------------------------------

pub use crate::sys::fmt::local_rfc3339;

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn stat_parsing_survives_odd_command_names() {
        let stat = "1234 (we ird) (name)) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0";
        assert_eq!(parse_stat(stat), Some(('S', 1, 987654)));
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (x) Z 0"), None);
    }

    #[test]
    fn cpu_time_is_the_four_cpu_fields_and_a_busy_process_has_some() {
        let stat = "1234 (we ird) (name)) S 1 1234 1234 0 -1 4194560 100 0 0 0 7 2 30 4 20 0 1 0 987654 1000 10";
        assert_eq!(parse_cpu_ticks(stat), Some(43));
        assert_eq!(parse_cpu_ticks("1 (x) S 1"), None);
        let me = std::process::id();
        let before = Processes::read().tree_cpu_secs(me).expect("own stat");
        let spin = std::time::Instant::now();
        let mut x = 0u64;
        while spin.elapsed() < std::time::Duration::from_millis(200) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let after = Processes::read().tree_cpu_secs(me).unwrap();
        assert!(after > before, "200 ms of spinning shows: {before} then {after}");
        assert_eq!(Processes::read().tree_cpu_secs(u32::MAX), None);
    }

    #[test]
    fn own_process_start_ticks_and_liveness() {
        let me = std::process::id();
        let t = start_ticks(me).expect("own stat");
        assert!(is_alive(me, t));
        assert!(!is_alive(me, t + 1), "another start time is another process");
        assert_eq!(start_ticks(u32::MAX), None);
        assert!(!is_alive(u32::MAX, t));
    }

    #[test]
    fn zombie_is_not_alive() {
        let child = std::process::Command::new("true").spawn().expect("spawn true");
        let pid = child.id();
        // Not waited for: once it exits it stays a zombie until reaped, and
        // its stat stays readable.
        let ticks = start_ticks(pid).expect("the child's stat, running or a zombie");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while read_stat(pid).map(|s| s.0) != Some('Z') {
            assert!(std::time::Instant::now() < deadline, "the child became a zombie: {:?}", read_stat(pid));
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(!is_alive(pid, ticks));
        let mut child = child;
        child.wait().unwrap();
    }

    #[test]
    fn descendants_include_self_and_children() {
        let me = std::process::id();
        let mut child = std::process::Command::new("sleep").arg("5").spawn().expect("spawn sleep");
        let d = descendants(me);
        assert_eq!(d.first(), Some(&me));
        assert!(d.contains(&child.id()), "{d:?} lacks {}", child.id());
        assert!(descendants(u32::MAX).is_empty());
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn descendants_in_walks_the_tree() {
        let procs = [(1, 0), (10, 1), (11, 10), (12, 11), (20, 1), (30, 30), (13, 10)];
        assert_eq!(descendants_in(10, &procs), vec![10, 11, 13, 12]);
        assert_eq!(descendants_in(12, &procs), vec![12]);
        assert_eq!(descendants_in(30, &procs), vec![30]);
    }

    #[test]
    fn memory_of_own_process() {
        let me = std::process::id();
        let rss = rss_bytes(me).expect("own statm");
        assert!(rss > 0);
        // Other test threads allocate and free between the two reads: the
        // tree (this process alone) is about the process, not exactly it.
        let tree = tree_rss_bytes(me).unwrap();
        assert!(tree >= rss / 2 && tree <= rss * 2, "{tree} beside {rss}");
        assert_eq!(rss_bytes(u32::MAX), None);
        assert_eq!(tree_rss_bytes(u32::MAX), None);
        assert_eq!(parse_statm_resident(b"100 25 3 1 0 20 0"), Some(25));
    }

    #[test]
    fn a_process_s_memory_is_its_proportional_share() {
        let rollup = b"55d8c6a1c000-7ffd3b1f9000 ---p 00000000 00:00 0                          [rollup]
Rss:              114484 kB
Pss:               79187 kB
Pss_Anon:          71900 kB
Shared_Clean:      10404 kB
Shared_Dirty:      32256 kB
Private_Clean:         0 kB
Private_Dirty:     71824 kB
";
        assert_eq!(parse_pss(rollup), Some(79187 * 1024));
        assert_eq!(parse_pss(b"nothing here"), None);
        let me = std::process::id();
        let (pss, rss) = (mem_bytes(me).unwrap(), rss_bytes(me).unwrap());
        // This test process shares its libraries with others: at most its
        // resident memory (other test threads move it a little meanwhile).
        assert!(pss > 0 && pss <= rss + rss / 4, "{pss} beside {rss}");
        assert_eq!(mem_bytes(u32::MAX), None);
        assert!(Processes::read().tree_mem_bytes(me).is_some_and(|t| t >= pss / 2));
    }

    #[test]
    fn one_snapshot_of_the_processes_counts_a_child_in_its_parents_tree() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let me = std::process::id();
        let processes = Processes::read();
        assert!(descendants_in(me, &processes.0).contains(&child.id()), "the child is in this process's tree");
        assert!(processes.tree_rss_bytes(me).unwrap() > 0);
        assert!(processes.tree_rss_bytes(child.id()).is_some_and(|b| b > 0), "a tree of one");
        assert_eq!(processes.tree_rss_bytes(u32::MAX), None);
        child.kill().unwrap();
        child.wait().unwrap();
    }

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
    fn mountinfo_is_read_with_its_escapes_undone() {
        let text = "\
36 35 98:0 /mnt1 /mnt/my\\040disk rw,noatime master:1 - ext3 /dev/root rw,errors=continue
37 35 0:31 /a\\011b\\134c /sys/fs/cgroup/memory rw,relatime shared:12 - cgroup cgroup rw,memory
not a mountinfo line
";
        let m = parse_mountinfo(text);
        assert_eq!(m.len(), 2, "{m:?}");
        assert_eq!(m[0].point, PathBuf::from("/mnt/my disk"));
        assert_eq!((m[0].root.as_path(), m[0].fs_type.as_str()), (std::path::Path::new("/mnt1"), "ext3"));
        assert_eq!(m[1].root, PathBuf::from("/a\tb\\c"));
        assert!(m[1].super_options.iter().any(|o| o == "memory"), "{m:?}");
        assert_eq!(unescape(b"/plain"), PathBuf::from("/plain"));
        assert!(mounts().iter().any(|m| m.point == std::path::Path::new("/")), "this process's root is a mount");
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
