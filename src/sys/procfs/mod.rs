//! Reading /proc: process liveness, start times, memory, command lines;
//! socket ownership in `sockets`, mounts in `mounts`.
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

use procfs::process::{SmapsRollup, StatM, Status};
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

mod held;
mod mounts;
mod sockets;

pub use held::Held;
pub use mounts::{mounts, parse_mountinfo, Mount};
pub use sockets::{listening, listening_by_port, listening_inodes, owner_among, port_holders, port_owned_by, Holder, Listening, PortOwner};
#[cfg(test)]
pub use sockets::{listening_inode, owns_socket};

// ---------------------------------------------------------------------------
// Command lines and environments
// ---------------------------------------------------------------------------

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
// Times (in `crate::sys::fmt`; named here too for the daemon's callers)
// ---------------------------------------------------------------------------

pub use crate::sys::fmt::local_rfc3339;

#[cfg(test)]
mod tests {
    use super::*;

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
}
