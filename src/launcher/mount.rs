//! The copy's mount namespace, built the way bubblewrap builds a sandbox's
//! root: a tmpfs becomes the new `/`, the host's top-level entries are
//! bind-mounted into it (recursively; symlinks such as `/bin -> usr/bin`
//! made anew), the app folder is bind-mounted read-only at [`APP_DIR`] (and
//! over its host path, so it is read-only there too), the scratch disk at
//! [`SCRATCH_DIR`], and then the root is pivoted and the old one detached.
//!
//! A new root, rather than mounts over the host's own tree, gives fixed
//! paths without creating anything in the host's `/`, and it is the shape
//! the fence needs: leaving out `$SHINYCTL_HOME`, `~/.ssh` or a private
//! /tmp is a choice made while the root is filled.

use std::path::Path;

use anyhow::Context;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{unshare, CloneFlags};

use super::{Namespaces, APP_DIR, SCRATCH_DIR};

/// Where the new root is built: the tmpfs is mounted over /tmp in the
/// copy's namespace only, and after the first pivot the host's /tmp is
/// reachable again under the old root.
const BASE: &str = "/tmp";

/// The outcome of trying to make the copy's namespace.
#[derive(Debug)]
pub enum Entered {
    /// The process is in its own mount namespace, with the new root.
    Yes,
    /// No namespace could be made, and nothing changed: the reason.
    Unavailable(String),
}

/// Moves this process into a mount namespace of its own with the copy's
/// root. `Unavailable` when the kernel refuses one before anything changed;
/// an error when a step after that fails (the copy must not start then).
pub fn enter(app_dir: &Path, scratch: &Path, ns: Namespaces) -> anyhow::Result<Entered> {
    if let Err(why) = unshare_namespaces(ns)? {
        return Ok(Entered::Unavailable(why));
    }
    // Nothing the copy mounts may reach the host, and nothing mounted on
    // the host later reaches the copy.
    if let Err(e) = mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>) {
        return Ok(Entered::Unavailable(format!("mounts cannot be made private here ({e})")));
    }
    let tmpfs_flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    if let Err(e) = mount(Some("tmpfs"), BASE, Some("tmpfs"), tmpfs_flags, Some("mode=0755")) {
        return Ok(Entered::Unavailable(format!("a tmpfs cannot be mounted here ({e})")));
    }
    build_root(app_dir, scratch)?;
    Ok(Entered::Yes)
}

/// Unshares the mount namespace: alone when this process may (root, or
/// the fence's choice), else together with a user namespace where the
/// copy keeps its own uid and gid. `Ok(Err(reason))` when neither can be
/// had; an error when a user namespace was made but cannot be set up.
fn unshare_namespaces(ns: Namespaces) -> anyhow::Result<Result<(), String>> {
    if !ns.user_always && unshare(CloneFlags::CLONE_NEWNS).is_ok() {
        return Ok(Ok(()));
    }
    let (uid, gid) = (nix::unistd::geteuid(), nix::unistd::getegid());
    if let Err(e) = unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS) {
        let why = match e {
            nix::errno::Errno::ENOSPC => "user namespaces are switched off here (user.max_user_namespaces is 0)".to_string(),
            nix::errno::Errno::EPERM => {
                "user namespaces are not allowed here (kernel.unprivileged_userns_clone, or an AppArmor/SELinux rule)".to_string()
            }
            e => format!("a user namespace cannot be made ({e})"),
        };
        return Ok(Err(why));
    }
    // From here the process is in a user namespace: failing to map its ids
    // would leave it running as nobody, so that is an error, not a fallback.
    std::fs::write("/proc/self/setgroups", "deny").context("cannot write /proc/self/setgroups")?;
    std::fs::write("/proc/self/uid_map", format!("{uid} {uid} 1")).context("cannot write /proc/self/uid_map")?;
    std::fs::write("/proc/self/gid_map", format!("{gid} {gid} 1")).context("cannot write /proc/self/gid_map")?;
    Ok(Ok(()))
}

/// Builds the copy's root on the tmpfs at [`BASE`] and pivots into it.
fn build_root(app_dir: &Path, scratch: &Path) -> anyhow::Result<()> {
    nix::unistd::chdir(BASE).context("cannot enter the new root's tmpfs")?;
    std::fs::create_dir("newroot").context("cannot make newroot")?;
    // pivot_root needs the new root to be a mount point.
    bind("newroot", "newroot", false)?;
    std::fs::create_dir("oldroot").context("cannot make oldroot")?;
    nix::unistd::pivot_root(".", "oldroot").context("cannot pivot into the tmpfs")?;
    nix::unistd::chdir("/").context("cannot enter /")?;
    fill_root(Path::new("/oldroot"), Path::new("/newroot"))?;
    let old = |p: &Path| Path::new("/oldroot").join(p.strip_prefix("/").unwrap_or(p));
    let new = |p: &Path| Path::new("/newroot").join(p.strip_prefix("/").unwrap_or(p));
    std::fs::create_dir_all(new(Path::new(APP_DIR))).context("cannot make the app folder's mount point")?;
    std::fs::create_dir_all(new(Path::new(SCRATCH_DIR))).context("cannot make the scratch disk's mount point")?;
    bind(old(app_dir), new(Path::new(APP_DIR)), true)?;
    // The host path of the app folder is in the new root too (through its
    // top-level folder): read-only there as well.
    if app_dir != Path::new("/") && new(app_dir).is_dir() {
        bind(old(app_dir), new(app_dir), true)?;
    }
    bind(old(scratch), new(Path::new(SCRATCH_DIR)), false)?;
    // Detach the old root, then make the new root `/` (pivot onto itself
    // and detach what ends up on top, as bubblewrap, runc and LXC do).
    mount(None::<&str>, "/oldroot", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .context("cannot make the old root private")?;
    umount2("/oldroot", MntFlags::MNT_DETACH).context("cannot detach the old root")?;
    nix::unistd::chdir("/newroot").context("cannot enter the new root")?;
    nix::unistd::pivot_root(".", ".").context("cannot pivot into the new root")?;
    umount2(".", MntFlags::MNT_DETACH).context("cannot detach the tmpfs")?;
    nix::unistd::chdir("/").context("cannot enter the new /")?;
    // The new `/` holds only mount points and symlinks: nothing to write.
    remount_read_only(Path::new("/"))?;
    Ok(())
}

/// Fills the new root with the old root's top-level entries: folders (and
/// files) bind-mounted recursively, symlinks made anew. An entry named like
/// the fixed folder of shinyctl's own is left out (it is shadowed), and so
/// is one that cannot be bound (a FUSE mount of another user, say), with a
/// line in the log: the copy may not need it, and if it does, the log says
/// why it is missing.
fn fill_root(old: &Path, new: &Path) -> anyhow::Result<()> {
    let own_top = Path::new(APP_DIR).iter().nth(1).map(|s| s.to_os_string());
    for entry in std::fs::read_dir(old).context("cannot list the host's /")? {
        let entry = entry.context("cannot list the host's /")?;
        let name = entry.file_name();
        if Some(&name) == own_top.as_ref() {
            continue;
        }
        let (from, to) = (entry.path(), new.join(&name));
        let kind = entry.file_type().with_context(|| format!("cannot stat {}", from.display()))?;
        if kind.is_symlink() {
            let target = std::fs::read_link(&from).with_context(|| format!("cannot read the symlink {}", from.display()))?;
            std::os::unix::fs::symlink(&target, &to).with_context(|| format!("cannot make the symlink {}", to.display()))?;
            continue;
        }
        if kind.is_dir() {
            std::fs::create_dir(&to).with_context(|| format!("cannot make {}", to.display()))?;
        } else if kind.is_file() {
            std::fs::File::create(&to).with_context(|| format!("cannot make {}", to.display()))?;
        } else {
            // Sockets, fifos and devices at the top level are left out.
            continue;
        }
        if let Err(e) = rbind(&from, &to) {
            super::log(&format!("--- shinyctl: /{} is left out of the copy's root: {e:#} ---", name.to_string_lossy()));
            let _ = if kind.is_dir() { std::fs::remove_dir(&to) } else { std::fs::remove_file(&to) };
        }
    }
    Ok(())
}

/// Bind-mounts `from` onto `to` with everything mounted below it.
fn rbind(from: &Path, to: &Path) -> anyhow::Result<()> {
    mount(Some(from), to, None::<&str>, MsFlags::MS_BIND | MsFlags::MS_REC, None::<&str>)
        .with_context(|| format!("cannot bind-mount {} onto {}", from.display(), to.display()))
}

/// Bind-mounts `from` onto `to` (not what is mounted below it), read-only
/// when asked: a bind mount takes the flags of its source, so read-only
/// needs a remount of the new mount.
fn bind(from: impl AsRef<Path>, to: impl AsRef<Path>, read_only: bool) -> anyhow::Result<()> {
    let (from, to) = (from.as_ref(), to.as_ref());
    mount(Some(from), to, None::<&str>, MsFlags::MS_BIND, None::<&str>)
        .with_context(|| format!("cannot bind-mount {} onto {}", from.display(), to.display()))?;
    if read_only {
        remount_read_only(to)?;
    }
    Ok(())
}

/// Remounts the mount at `path` read-only, keeping the flags it has: in a
/// user namespace the kernel refuses to drop nosuid, nodev, noexec or the
/// atime flags of a mount that came from the host.
fn remount_read_only(path: &Path) -> anyhow::Result<()> {
    use nix::sys::statvfs::{statvfs, FsFlags};
    let have = statvfs(path).with_context(|| format!("cannot statvfs {}", path.display()))?.flags();
    let mut flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY;
    for (fs, ms) in [
        (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
        (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
        (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
        (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
    ] {
        if have.contains(fs) {
            flags |= ms;
        }
    }
    mount(None::<&str>, path, None::<&str>, flags, None::<&str>)
        .with_context(|| format!("cannot make {} read-only", path.display()))
}
