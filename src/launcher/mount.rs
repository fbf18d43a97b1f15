//! The copy's mount namespace (made by the clone in `host.rs`, built here
//! by the init), the way bubblewrap builds a sandbox's root: a tmpfs
//! becomes the new `/`; the host's top-level entries are bind-mounted into
//! it recursively and read-only, /sys too (symlinks such as `/bin ->
//! usr/bin` made anew); /tmp and /dev/shm are the copy's own folders on
//! disk, /proc a proc of its PID namespace with what reaches the host
//! (`/proc/sys`, `sysrq-trigger`, …) bound read-only over itself, and /dev
//! a read-only tmpfs of its own with only the devices R needs (see
//! [`make_dev`]); SHINYCTL_HOME,
//! the secrets and `hidden-paths` are covered; the writable paths, the
//! scratch disk (also at [`SCRATCH_DIR`]) and the app folder (read-only,
//! also at [`APP_DIR`]) are bound over that; then the root is pivoted and
//! the old one detached.
//!
//! A new root, rather than mounts over the host's own tree, gives fixed
//! paths without creating anything in the host's `/`, and it is the shape
//! the fence needs: leaving out `$SHINYCTL_HOME`, `~/.ssh` or a private
//! /tmp is a choice made while the root is filled.

use std::path::{Path, PathBuf};

use anyhow::Context;
use nix::mount::{mount, umount2, MntFlags, MsFlags};

use super::plan::{under, RootPlan, R_LIBS_DIR};
use super::sources::Sources;
use super::{APP_DIR, SCRATCH_DIR};

/// Where the new root is built: the tmpfs is mounted over /tmp in the
/// copy's namespace only, and after the first pivot the host's /tmp is
/// reachable again under the old root.
const BASE: &str = "/tmp";

/// The host's devices a copy gets in its /dev, each bound alone (a user
/// namespace may not mknod): what R and the tools it runs open.
const DEVICES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

/// What of a proc reaches beyond the copy (sysctls, the magic SysRq key,
/// interrupts, buses, filesystems' settings): bound read-only over itself,
/// as bubblewrap and runc do.
const PROC_READ_ONLY: [&str; 5] = ["sys", "sysrq-trigger", "irq", "bus", "fs"];

/// What the copy's root turned out to have.
#[derive(Debug, Clone, Default)]
pub struct Built {
    /// Why /proc is the host's (a proc of the copy's PID namespace could not
    /// be mounted), when it is.
    pub host_proc: Option<String>,
    /// The copy's /dev (a tmpfs), made read-only once every mount point is
    /// made.
    pub dev: Option<PathBuf>,
}

/// Builds the copy's root in this process's (new) mount namespace and
/// pivots into it. Any failure is an error: the copy must not start half
/// fenced.
pub fn build(plan: &RootPlan, sources: &Sources) -> anyhow::Result<Built> {
    // Nothing the copy mounts may reach the host, and nothing mounted on
    // the host later reaches the copy.
    mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .context("mounts cannot be made private here")?;
    let tmpfs_flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    mount(Some("tmpfs"), BASE, Some("tmpfs"), tmpfs_flags, Some("mode=0755")).context("a tmpfs cannot be mounted here")?;
    build_root(plan, sources)
}

/// Builds the copy's root on the tmpfs at [`BASE`] and pivots into it.
fn build_root(plan: &RootPlan, sources: &Sources) -> anyhow::Result<Built> {
    nix::unistd::chdir(BASE).context("cannot enter the new root's tmpfs")?;
    std::fs::create_dir("newroot").context("cannot make newroot")?;
    // pivot_root needs the new root to be a mount point.
    bind("newroot", "newroot", false)?;
    std::fs::create_dir("oldroot").context("cannot make oldroot")?;
    // The empty file bound over hidden files.
    std::fs::File::create("empty").context("cannot make the empty file")?;
    nix::unistd::pivot_root(".", "oldroot").context("cannot pivot into the tmpfs")?;
    nix::unistd::chdir("/").context("cannot enter /")?;
    let built = fill_root(Path::new("/oldroot"), Path::new("/newroot"), plan, sources)?;
    let masks = hide(plan)?;
    expose(plan, sources)?;
    for m in masks.iter().map(PathBuf::as_path).chain(built.dev.as_deref()) {
        remount_read_only(m)?;
    }
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
    Ok(built)
}

/// Fills the new root with the old root's top-level entries: folders (and
/// files) bind-mounted recursively and read-only, symlinks made anew;
/// `/tmp` is the copy's own folder, `/proc` a new proc of its PID namespace
/// (the host's, read-only, where none can be mounted), `/dev` the copy's
/// own ([`make_dev`]). An entry named
/// like the fixed folder of shinyctl's own is left out (it is shadowed),
/// and so is one that cannot be bound (a FUSE mount of another user, say),
/// with a line in the log: the copy may not need it, and if it does, the
/// log says why it is missing.
fn fill_root(old: &Path, new: &Path, plan: &RootPlan, sources: &Sources) -> anyhow::Result<Built> {
    let own_top = Path::new(APP_DIR).iter().nth(1).map(|s| s.to_os_string());
    let mut built = Built::default();
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
        match name.to_str() {
            Some("tmp") => {
                bind(sources.from("/oldroot", &plan.tmp), &to, false)?;
                continue;
            }
            Some("proc") => match mount_proc(&to) {
                Ok(()) => {
                    cover_proc(&to)?;
                    continue;
                }
                Err(e) => built.host_proc = Some(format!("{e:#}")),
            },
            Some("dev") if kind.is_dir() => {
                make_dev(&from, &to, sources.from("/oldroot", &plan.shm))?;
                built.dev = Some(to);
                continue;
            }
            _ => {}
        }
        if let Err(e) = rbind(&from, &to) {
            super::log(&format!("--- shinyctl: /{} is left out of the copy's root: {e:#} ---", name.to_string_lossy()));
            let _ = if kind.is_dir() { std::fs::remove_dir(&to) } else { std::fs::remove_file(&to) };
            continue;
        }
        read_only_tree(&to)?;
    }
    Ok(built)
}

/// Binds what of a new proc reaches the host ([`PROC_READ_ONLY`])
/// read-only over itself; what this kernel lacks is skipped.
fn cover_proc(proc: &Path) -> anyhow::Result<()> {
    for name in PROC_READ_ONLY {
        let p = proc.join(name);
        if p.exists() {
            bind(&p, &p, true)?;
        }
    }
    Ok(())
}

/// Makes the copy's /dev at `to`, as bubblewrap's `--dev` does: a tmpfs
/// (made read-only once the root is built) holding the host's [`DEVICES`]
/// (from `host`, each bound alone), a devpts of its own (`pts`, `ptmx`),
/// the copy's own `shm` folder, the IPC namespace's `mqueue`, and the
/// links `fd`, `stdin`, `stdout`, `stderr` into /proc/self/fd. A device or
/// devpts the machine lacks is left out with a line in the log.
fn make_dev(host: &Path, to: &Path, shm: PathBuf) -> anyhow::Result<()> {
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC;
    mount(Some("tmpfs"), to, Some("tmpfs"), flags, Some("mode=0755,size=64k")).context("a tmpfs for the copy's /dev cannot be mounted")?;
    for dev in DEVICES {
        let (from, at) = (host.join(dev), to.join(dev));
        let res = std::fs::File::create(&at).with_context(|| format!("cannot make {}", at.display())).and_then(|_| bind(&from, &at, false));
        if let Err(e) = res {
            super::log(&format!("--- shinyctl: /dev/{dev} is left out of the copy's root: {e:#} ---"));
            let _ = std::fs::remove_file(&at);
        }
    }
    for dir in ["pts", "shm", "mqueue"] {
        std::fs::create_dir(to.join(dir)).with_context(|| format!("cannot make /dev/{dir}"))?;
    }
    let pts = mount(Some("devpts"), &to.join("pts"), Some("devpts"), flags, Some("newinstance,ptmxmode=0666,mode=620"));
    match pts {
        Ok(()) => std::os::unix::fs::symlink("pts/ptmx", to.join("ptmx")).context("cannot make /dev/ptmx")?,
        Err(e) => super::log(&format!("--- shinyctl: the copy has no terminals of its own (/dev/pts): {e} ---")),
    }
    bind(&shm, to.join("shm"), false)?;
    // The IPC namespace's own message queues, where the kernel has them.
    let _ = mount(Some("mqueue"), &to.join("mqueue"), Some("mqueue"), flags | MsFlags::MS_NODEV, None::<&str>);
    for (link, target) in
        [("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")]
    {
        std::os::unix::fs::symlink(target, to.join(link)).with_context(|| format!("cannot make /dev/{link}"))?;
    }
    Ok(())
}

/// Mounts a proc of this process's PID namespace at `to`.
fn mount_proc(to: &Path) -> anyhow::Result<()> {
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mount(Some("proc"), to, Some("proc"), flags, None::<&str>).context("a proc of the copy's PID namespace cannot be mounted")
}

/// Covers each hidden path in the new root: a folder with an empty tmpfs
/// (left writable until [`expose`] has made its mount points; the caller
/// makes it read-only), a file with the empty file. Paths below another
/// hidden one are hidden with it. Returns the tmpfs mounts.
fn hide(plan: &RootPlan) -> anyhow::Result<Vec<PathBuf>> {
    let mut hidden = plan.hidden.clone();
    hidden.sort_by_key(|p| p.components().count());
    let mut done: Vec<&PathBuf> = Vec::new();
    let mut masks = Vec::new();
    for h in &hidden {
        if done.iter().any(|d| h.starts_with(d)) {
            continue;
        }
        let target = under("/newroot", h);
        let Ok(meta) = std::fs::metadata(&target) else { continue };
        if meta.is_dir() {
            let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
            mount(Some("tmpfs"), &target, Some("tmpfs"), flags, Some("mode=0755,size=64k"))
                .with_context(|| format!("cannot hide {}", h.display()))?;
            masks.push(target);
        } else {
            bind("/empty", &target, true).with_context(|| format!("cannot hide {}", h.display()))?;
        }
        done.push(h);
    }
    Ok(masks)
}

/// Binds what the copy may see below hidden or read-only places: the
/// writable paths, the scratch disk (at [`SCRATCH_DIR`] and its own path)
/// and the app folder read-only (at [`APP_DIR`] and its own path), each
/// parent before its children. A mount point that is missing is made (in a
/// hidden path's tmpfs, the copy's /tmp, the new root); one that cannot be
/// is left out with a line in the log, but for the fixed paths.
fn expose(plan: &RootPlan, sources: &Sources) -> anyhow::Result<()> {
    let mut binds: Vec<(PathBuf, PathBuf, bool, bool)> = Vec::new();
    for w in &plan.writable {
        binds.push((w.clone(), w.clone(), false, false));
    }
    for n in &plan.needed {
        if n.starts_with(BASE) || plan.hidden.iter().any(|h| n.starts_with(h)) {
            binds.push((n.clone(), n.clone(), true, false));
        }
    }
    // At their own paths too, but not below /tmp: that is the copy's own
    // folder, which mount points would litter.
    for (p, read_only) in [(&plan.scratch, false), (&plan.app_dir, true)] {
        if !p.starts_with(BASE) {
            binds.push((p.clone(), p.clone(), read_only, false));
        }
    }
    binds.push((plan.scratch.clone(), SCRATCH_DIR.into(), false, true));
    binds.push((plan.app_dir.clone(), APP_DIR.into(), true, true));
    for (i, lib) in plan.libraries.iter().enumerate() {
        binds.push((lib.clone(), PathBuf::from(format!("{R_LIBS_DIR}/{i}")), true, false));
    }
    binds.sort_by_key(|(_, at, _, _)| at.components().count());
    for (from, at, read_only, required) in binds {
        if at == Path::new("/") {
            continue;
        }
        let (from, to) = (sources.from("/oldroot", &from), under("/newroot", &at));
        let made = match from.is_dir() {
            true => std::fs::create_dir_all(&to),
            false => to.parent().map_or(Ok(()), std::fs::create_dir_all).and_then(|_| match to.exists() {
                true => Ok(()),
                false => std::fs::File::create(&to).map(drop),
            }),
        };
        let res = made.with_context(|| format!("cannot make the mount point {}", at.display())).and_then(|_| bind(&from, &to, read_only));
        match res {
            Ok(()) => {}
            Err(e) if required => return Err(e),
            // A place the copy's user cannot walk to (a run-as copy's
            // release at its own path below /root): R could not reach it
            // there either, so nothing is missing.
            Err(e) if e.root_cause().downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == std::io::ErrorKind::PermissionDenied) => {
            }
            Err(e) => super::log(&format!("--- shinyctl: {} is not in the copy's root: {e:#} ---", at.display())),
        }
    }
    Ok(())
}

/// Makes the mount at `path` and every mount below it read-only
/// (mount_setattr with AT_RECURSIVE, Linux 5.12; a raw syscall: neither
/// nix nor libc wrap it).
fn read_only_tree(path: &Path) -> anyhow::Result<()> {
    #[repr(C)]
    struct MountAttr {
        attr_set: u64,
        attr_clr: u64,
        propagation: u64,
        userns_fd: u64,
    }
    const MOUNT_ATTR_RDONLY: u64 = 0x1;
    const AT_RECURSIVE: libc::c_uint = 0x8000;
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).context("a path with a NUL")?;
    let attr = MountAttr { attr_set: MOUNT_ATTR_RDONLY, attr_clr: 0, propagation: 0, userns_fd: 0 };
    // SAFETY: a path and a mount_attr of the size passed, both alive for the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            c.as_ptr(),
            AT_RECURSIVE,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc != 0 {
        // An older kernel: the top mount alone, with the flags it has.
        return remount_read_only(path);
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
    mount(None::<&str>, path, None::<&str>, flags, None::<&str>).with_context(|| format!("cannot make {} read-only", path.display()))
}
