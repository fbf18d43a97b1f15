//! The list of a copy's fences as the launcher fills it in: each is in
//! force, missing (with the reason and the fix) or off. The namespaces are
//! filled here; `landlock`, `seccomp` and `cgroup` are slots the filter and
//! the limits fill where they are applied.

use serde::{Deserialize, Serialize};

use crate::manifest::{Sandbox, SandboxMode};
use crate::wire::{Fence, FenceState, Isolation};

/// The user namespace: the copy keeps no capability on the host.
pub const USER_NS: &str = "user-ns";
/// The mount namespace: its own root, hidden paths, the release read-only.
pub const MOUNT_NS: &str = "mount-ns";
/// The PID namespace: it sees and signals only its own processes.
pub const PID_NS: &str = "pid-ns";
/// The IPC namespace: no shared memory or queues with the host.
pub const IPC_NS: &str = "ipc-ns";
/// The UTS namespace: its own hostname.
pub const UTS_NS: &str = "uts-ns";
/// Landlock (the filter's slot).
pub const LANDLOCK: &str = "landlock";
/// The system-call filter (the filter's slot).
pub const SECCOMP: &str = "seccomp";
/// The cgroup with the memory and tasks limits (the limits' slot).
pub const CGROUP: &str = "cgroup";
/// `bind` and `listen` answered by the copy's init: it listens only on its
/// own port on 127.0.0.1 (`ports.rs`).
pub const PORTS: &str = "ports";

/// The namespaces, in the order status lists them.
pub const NAMESPACES: [&str; 5] = [USER_NS, MOUNT_NS, PID_NS, IPC_NS, UTS_NS];

/// The fix for a machine that refuses unprivileged user namespaces.
pub const FIX_USERNS_EPERM: &str = "sysctl kernel.apparmor_restrict_unprivileged_userns=0 (Ubuntu 24.04's AppArmor default) \
or kernel.unprivileged_userns_clone=1 (Debian), or run the daemon as root";
/// The fix for a machine where user namespaces are switched off.
pub const FIX_USERNS_ENOSPC: &str = "sysctl user.max_user_namespaces=15000";

/// A copy's fences while the launcher makes them; sent from the process
/// about to exec R to the host-side launcher, which reports them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fences {
    /// Every fence, in a fixed order.
    pub list: Vec<Fence>,
}

impl Fences {
    /// Every fence off with `why` (the starting point: the launcher turns
    /// each on as it is made).
    pub fn all_off(why: &str) -> Fences {
        let names = NAMESPACES.iter().chain([LANDLOCK, SECCOMP, PORTS, CGROUP].iter());
        let list = names.map(|n| Fence { name: n.to_string(), state: FenceState::Off, reason: Some(why.to_string()), fix: None }).collect();
        Fences { list }
    }

    /// The fences of a copy in `mode`, before anything is made: off for
    /// `mode: off`; otherwise the namespaces wanted (missing until made),
    /// the others' slots off until they fill them.
    pub fn wanted(mode: SandboxMode) -> Fences {
        if mode == SandboxMode::Off {
            return Fences::all_off("sandbox mode off");
        }
        let mut f = Fences::all_off("not applied by this build");
        for n in NAMESPACES {
            f.missing(n, "not made", None);
        }
        f
    }

    fn slot(&mut self, name: &str) -> &mut Fence {
        if let Some(i) = self.list.iter().position(|f| f.name == name) {
            return &mut self.list[i];
        }
        self.list.push(Fence { name: name.to_string(), state: FenceState::Off, reason: None, fix: None });
        self.list.last_mut().expect("just pushed")
    }

    /// Marks a fence as in force.
    pub fn in_force(&mut self, name: &str) {
        *self.slot(name) = Fence { name: name.to_string(), state: FenceState::InForce, reason: None, fix: None };
    }

    /// Marks a fence as missing, with why and what would give it.
    pub fn missing(&mut self, name: &str, reason: &str, fix: Option<&str>) {
        *self.slot(name) =
            Fence { name: name.to_string(), state: FenceState::Missing, reason: Some(reason.to_string()), fix: fix.map(str::to_string) };
    }

    /// Marks a fence as off (not wanted), with why.
    pub fn off(&mut self, name: &str, reason: &str) {
        *self.slot(name) = Fence { name: name.to_string(), state: FenceState::Off, reason: Some(reason.to_string()), fix: None };
    }

    /// True when the fence is in force.
    pub fn has(&self, name: &str) -> bool {
        self.list.iter().any(|f| f.name == name && f.state == FenceState::InForce)
    }

    /// For `mode: strict`: why the copy must not start (the missing
    /// fences, then their reasons, each once), or none when nothing is
    /// missing.
    pub fn strict_refusal(&self) -> Option<String> {
        let missing: Vec<&Fence> = self.list.iter().filter(|f| f.state == FenceState::Missing).collect();
        if missing.is_empty() {
            return None;
        }
        let names: Vec<&str> = missing.iter().map(|f| f.name.as_str()).collect();
        let mut reasons: Vec<&str> = Vec::new();
        for r in missing.iter().map(|f| f.reason.as_deref().unwrap_or("missing")) {
            if !reasons.contains(&r) {
                reasons.push(r);
            }
        }
        // A reason that another one repeats in full says nothing more.
        let kept: Vec<&str> = reasons.iter().copied().filter(|r| !reasons.iter().any(|o| o != r && o.contains(r))).collect();
        Some(format!("sandbox mode strict and fences are missing: {} ({})", names.join(", "), kept.join("; ")))
    }

    /// One phrase for the log line: what is in force and what is missing.
    pub fn summary(&self) -> String {
        let pick = |s: FenceState| self.list.iter().filter(|f| f.state == s).map(|f| f.name.as_str()).collect::<Vec<_>>().join(" ");
        let (on, missing) = (pick(FenceState::InForce), pick(FenceState::Missing));
        match missing.is_empty() {
            true => format!("fences {on}"),
            false => format!("fences {on}; missing {missing}"),
        }
    }
}

/// True when the manifest asked for something only this fence gives: the
/// mount namespace for `hidden-paths` and `writable-paths`, the cgroup for
/// `memory`.
pub fn asked_for(sandbox: &Sandbox, fence: &str) -> bool {
    match fence {
        MOUNT_NS => !sandbox.hidden_paths.is_empty() || !sandbox.writable_paths.is_empty(),
        CGROUP => sandbox.memory.is_some(),
        _ => false,
    }
}

/// The lines under the status table about missing fences: only for an app
/// in `mode: strict`, or one that asked for what is missing, one line per
/// fence (the copies that lack it, the reason, the fix).
pub fn notes(app: &str, sandbox: &Sandbox, copies: &[(u32, &Isolation)]) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    let mut seen: Vec<&str> = Vec::new();
    for (_, iso) in copies {
        for f in iso.missing() {
            if seen.contains(&f.name.as_str()) || !(sandbox.mode == SandboxMode::Strict || asked_for(sandbox, &f.name)) {
                continue;
            }
            seen.push(&f.name);
            let which: Vec<String> =
                copies.iter().filter(|(_, i)| i.missing().any(|m| m.name == f.name)).map(|(c, _)| c.to_string()).collect();
            let fix = f.fix.as_deref().map(|x| format!("; fix: {x}")).unwrap_or_default();
            lines.push(format!(
                "{app}: copy {} runs without its {}: {}{fix}",
                which.join(", "),
                f.name,
                f.reason.as_deref().unwrap_or("missing")
            ));
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_mode_wants_nothing_and_strict_refuses_what_is_missing() {
        assert!(Fences::wanted(SandboxMode::Off).strict_refusal().is_none());
        let mut f = Fences::wanted(SandboxMode::Strict);
        for n in NAMESPACES {
            f.in_force(n);
        }
        assert!(f.strict_refusal().is_none(), "the others' slots are off until they fill them");
        f.missing(PID_NS, "no /proc", None);
        let why = f.strict_refusal().unwrap();
        assert!(why.ends_with("missing: pid-ns (no /proc)"), "{why}");
        f.missing(USER_NS, "refused", None);
        f.missing(IPC_NS, "refused; and more", None);
        let why = f.strict_refusal().unwrap();
        assert!(why.ends_with("missing: user-ns, pid-ns, ipc-ns (no /proc; refused; and more)"), "{why}");
        assert_eq!(f.summary(), "fences mount-ns uts-ns; missing user-ns pid-ns ipc-ns");
        f.in_force(CGROUP);
        assert!(f.has(CGROUP) && f.list.len() == 9);
    }

    #[test]
    fn a_missing_fence_is_a_line_only_when_asked_for_or_strict() {
        let mut f = Fences::wanted(SandboxMode::On);
        f.missing(MOUNT_NS, "user namespaces are not allowed here", Some(FIX_USERNS_EPERM));
        f.missing(PID_NS, "user namespaces are not allowed here", Some(FIX_USERNS_EPERM));
        let iso = Isolation { kind: crate::wire::IsolationKind::Landlock, reason: None, fences: f.list, user: None, start: None };
        let copies = [(1, &iso), (2, &iso)];
        assert!(notes("a", &Sandbox::default(), &copies).is_empty(), "nothing asked for");
        let asked = Sandbox { writable_paths: vec!["/srv".into()], ..Sandbox::default() };
        let lines = notes("a", &asked, &copies);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].starts_with("a: copy 1, 2 runs without its mount-ns: user namespaces are not allowed here; fix: sysctl"),
            "{lines:?}"
        );
        let strict = Sandbox { mode: SandboxMode::Strict, ..Sandbox::default() };
        assert_eq!(notes("a", &strict, &copies).len(), 5, "every missing fence: the namespaces");
    }
}
