//! A copy's disk of its own, with a size (`sandbox.disk`; README, "The
//! fence"), as a root launcher makes it on the host before any namespace:
//! a sparse image file beside the scratch folder ([`image_path`]), made an
//! ext4 without a journal (`mkfs.ext4`: an empty 1G one takes under a
//! megabyte of the host's disk), attached to a free loop device
//! (`LOOP_CONFIGURE` with autoclear, so the device goes when its filesystem
//! is unmounted, and direct I/O where the host allows it),
//! mounted detached (`fsopen`/`fsmount`, nosuid and nodev), and its
//! `scratch`, `tmp` and `shm` folders moved onto the copy's scratch folder
//! and the `<scratch>.tmp` and `<scratch>.shm` folders beside it. The
//! copy's namespace then sees them through its usual bind mounts, and the
//! host (tests, operators) reads the scratch folder where it always was.
//!
//! The mounts outlive the copy (its disk is kept through sleep and
//! restarts: a later start finds them made); the daemon detaches them when
//! the disk is forgotten ([`detach_below`], for a redeploy and `delete`).

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use anyhow::Context;

/// `<scratch>.img`, beside the scratch folder: the copy's filesystem.
pub fn image_path(scratch: &Path) -> PathBuf {
    let name = scratch.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    scratch.with_file_name(format!("{name}.img"))
}

/// `<scratch>.tmp`: the copy's /tmp (the launcher's `landlock::own_tmp` makes it).
pub fn tmp_path(scratch: &Path) -> PathBuf {
    let name = scratch.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    scratch.with_file_name(format!("{name}.tmp"))
}

/// `<scratch>.shm`, beside the scratch disk: the copy's /dev/shm.
pub fn shm_path(scratch: &Path) -> PathBuf {
    let name = scratch.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    scratch.with_file_name(format!("{name}.shm"))
}

/// A copy's scratch folder, /tmp and /dev/shm on the host: what its disk
/// holds.
pub fn folders(scratch: &Path) -> [PathBuf; 3] {
    [scratch.to_path_buf(), tmp_path(scratch), shm_path(scratch)]
}

/// What [`attach`] found or did.
#[derive(Debug, PartialEq, Eq)]
pub enum Attached {
    /// The disk was mounted already (an earlier start of this copy).
    Already,
    /// The disk is mounted now, from this loop device.
    Mounted(String),
}

/// Makes `scratch`, `tmp` and `shm` the folders of one filesystem of
/// `size` bytes, given to `owner` (uid, gid). Root only. A scratch folder
/// that holds files from before it had a disk is refused (they would be
/// hidden under the mount): the caller runs the copy without a size.
pub fn attach(scratch: &Path, tmp: &Path, shm: &Path, size: u64, owner: Option<(u32, u32)>) -> anyhow::Result<Attached> {
    if is_mount_point(scratch) {
        return Ok(Attached::Already);
    }
    let image = image_path(scratch);
    if !image.exists() {
        if std::fs::read_dir(scratch).map(|mut d| d.next().is_some()).unwrap_or(false) {
            anyhow::bail!("{} holds files from before it had a disk of its own", scratch.display());
        }
        make_image(&image, size)?;
    }
    let device = loop_attach(&image)?;
    let name = device.1.clone();
    let mounted = mount_detached(&device.1).with_context(|| format!("cannot mount {} (from {})", device.1, image.display()))?;
    // The superblock holds the device now; autoclear frees it at unmount.
    drop(device);
    let places = [("scratch", scratch), ("tmp", tmp), ("shm", shm)];
    for (i, (sub, at)) in places.iter().enumerate() {
        if let Err(e) = place(&mounted, sub, at, owner) {
            for (_, done) in &places[..i] {
                detach(done);
            }
            return Err(e);
        }
    }
    Ok(Attached::Mounted(name))
}

/// A sparse file of `size` bytes made an ext4 without a journal, no blocks
/// kept for root (the app gets the whole size) and its inode tables left
/// for the kernel to zero lazily (so an empty image stays small).
fn make_image(image: &Path, size: u64) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let made = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(image);
    made.and_then(|f| f.set_len(size)).with_context(|| format!("cannot make the disk image {}", image.display()))?;
    let out = std::process::Command::new("mkfs.ext4")
        .args(["-q", "-F", "-O", "^has_journal", "-m", "0", "-E", "lazy_itable_init=1,nodiscard", "-L", "shinyctl-disk"])
        .arg(image)
        .stdin(std::process::Stdio::null())
        .output();
    let failed = match out {
        Ok(o) if o.status.success() => return Ok(()),
        Ok(o) => format!("{}: {}", o.status, String::from_utf8_lossy(&o.stderr).trim()),
        Err(e) => format!("{e} (install e2fsprogs)"),
    };
    let _ = std::fs::remove_file(image);
    anyhow::bail!("mkfs.ext4 cannot make {}: {failed}", image.display())
}

/// `struct loop_info64` (linux/loop.h).
#[repr(C)]
struct LoopInfo64 {
    device: u64,
    inode: u64,
    rdevice: u64,
    offset: u64,
    sizelimit: u64,
    number: u32,
    encrypt_type: u32,
    encrypt_key_size: u32,
    flags: u32,
    file_name: [u8; 64],
    crypt_name: [u8; 64],
    encrypt_key: [u8; 32],
    init: [u64; 2],
}

/// `struct loop_config` (linux/loop.h, Linux 5.8).
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LO_FLAGS_AUTOCLEAR: u32 = 4;
const LO_FLAGS_DIRECT_IO: u32 = 16;

/// Attaches `image` to a free loop device with autoclear; returns the
/// device open and its path. A device another process takes between
/// asking for it and configuring it is skipped for the next.
fn loop_attach(image: &Path) -> anyhow::Result<(OwnedFd, String)> {
    let rw = |p: &Path| std::fs::OpenOptions::new().read(true).write(true).open(p);
    let file = rw(image).with_context(|| format!("cannot open the disk image {}", image.display()))?;
    let ctl = rw(Path::new("/dev/loop-control")).context("no loop devices here (/dev/loop-control)")?;
    let mut last = None;
    for _ in 0..16 {
        // SAFETY: an ioctl without an argument on a descriptor we own.
        let n = unsafe { libc::ioctl(ctl.as_raw_fd(), LOOP_CTL_GET_FREE as _) };
        if n < 0 {
            return Err(std::io::Error::last_os_error()).context("no free loop device (LOOP_CTL_GET_FREE)");
        }
        let path = format!("/dev/loop{n}");
        let dev = rw(Path::new(&path)).with_context(|| format!("cannot open {path}"))?;
        // SAFETY: all-zero is a valid loop_config.
        let mut cfg: LoopConfig = unsafe { std::mem::zeroed() };
        cfg.fd = file.as_raw_fd() as u32;
        let name = image.as_os_str().as_bytes();
        let len = name.len().min(63);
        cfg.info.file_name[..len].copy_from_slice(&name[..len]);
        // Direct I/O where the host's filesystem allows it: the image's
        // pages are not cached twice (a write to the copy's disk runs near
        // the host's speed instead of at half of it; bench/fence.sh).
        let mut e = None;
        for flags in [LO_FLAGS_AUTOCLEAR | LO_FLAGS_DIRECT_IO, LO_FLAGS_AUTOCLEAR] {
            cfg.info.flags = flags;
            // SAFETY: a loop_config of the kernel's layout, alive for the call.
            if unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CONFIGURE as _, &cfg as *const LoopConfig) } == 0 {
                return Ok((dev.into(), path));
            }
            e = Some(std::io::Error::last_os_error());
            if e.as_ref().and_then(|e| e.raw_os_error()) != Some(libc::EINVAL) {
                break;
            }
        }
        let e = e.unwrap_or_else(std::io::Error::last_os_error);
        if e.raw_os_error() != Some(libc::EBUSY) {
            return Err(e).with_context(|| format!("cannot attach {} to {path} (LOOP_CONFIGURE)", image.display()));
        }
        last = Some(e);
    }
    Err(anyhow::anyhow!("every free loop device was taken first: {last:?}"))
}

/// A raw syscall's result as a descriptor.
fn fd_or_error(rc: libc::c_long, what: &str) -> anyhow::Result<OwnedFd> {
    if rc < 0 {
        return Err(std::io::Error::last_os_error()).context(what.to_string());
    }
    // SAFETY: the kernel just returned this descriptor to us alone.
    Ok(unsafe { OwnedFd::from_raw_fd(rc as RawFd) })
}

/// A C string of a Rust one with no NUL.
fn c(s: &str) -> CString {
    CString::new(s).unwrap_or_default()
}

/// Mounts the ext4 on `device`, attached nowhere (fsopen, fsconfig,
/// fsmount: Linux 5.2), nosuid and nodev; returns the mount.
fn mount_detached(device: &str) -> anyhow::Result<OwnedFd> {
    const FSOPEN_CLOEXEC: libc::c_uint = 1;
    const FSCONFIG_SET_FLAG: libc::c_uint = 0;
    const FSCONFIG_SET_STRING: libc::c_uint = 1;
    const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
    const FSMOUNT_CLOEXEC: libc::c_uint = 1;
    const MOUNT_ATTR_NOSUID: libc::c_uint = 0x2;
    const MOUNT_ATTR_NODEV: libc::c_uint = 0x4;
    let ext4 = c("ext4");
    // SAFETY: a NUL-terminated name; the kernel returns a new descriptor.
    let fs = fd_or_error(unsafe { libc::syscall(libc::SYS_fsopen, ext4.as_ptr(), FSOPEN_CLOEXEC) }, "fsopen ext4")?;
    let set = |cmd: libc::c_uint, key: Option<&str>, value: Option<&str>| -> anyhow::Result<()> {
        let (k, v) = (key.map(c), value.map(c));
        let ptr = |s: &Option<CString>| s.as_ref().map_or(std::ptr::null(), |s| s.as_ptr());
        // SAFETY: NUL-terminated strings (or null) alive for the call.
        let rc = unsafe { libc::syscall(libc::SYS_fsconfig, fs.as_raw_fd(), cmd, ptr(&k), ptr(&v), 0) };
        if rc < 0 {
            return Err(std::io::Error::last_os_error()).with_context(|| format!("fsconfig {}", key.unwrap_or("create")));
        }
        Ok(())
    };
    set(FSCONFIG_SET_STRING, Some("source"), Some(device))?;
    // The inode tables stay unwritten until used: an empty disk stays small.
    set(FSCONFIG_SET_FLAG, Some("noinit_itable"), None)?;
    set(FSCONFIG_CMD_CREATE, None, None)?;
    // SAFETY: a configured filesystem context we own.
    let rc = unsafe { libc::syscall(libc::SYS_fsmount, fs.as_raw_fd(), FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV) };
    fd_or_error(rc, "fsmount")
}

/// Makes the folder `sub` at the top of `mounted` (mode 0700, `owner`'s)
/// and mounts it at `at` on the host (open_tree, move_mount).
fn place(mounted: &OwnedFd, sub: &str, at: &Path, owner: Option<(u32, u32)>) -> anyhow::Result<()> {
    const OPEN_TREE_CLONE: libc::c_uint = 1;
    const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 4;
    let name = c(sub);
    // SAFETY: a NUL-terminated name below a descriptor we own.
    if unsafe { libc::mkdirat(mounted.as_raw_fd(), name.as_ptr(), 0o700) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::AlreadyExists {
            return Err(e).with_context(|| format!("cannot make {sub} on the copy's disk"));
        }
    }
    if let Some((uid, gid)) = owner {
        // SAFETY: as above.
        if unsafe { libc::fchownat(mounted.as_raw_fd(), name.as_ptr(), uid, gid, libc::AT_SYMLINK_NOFOLLOW) } != 0 {
            return Err(std::io::Error::last_os_error()).with_context(|| format!("cannot give {sub} on the copy's disk to {uid}"));
        }
    }
    std::fs::create_dir_all(at).with_context(|| format!("cannot make {}", at.display()))?;
    let flags = OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint;
    // SAFETY: as above; the kernel returns a new descriptor.
    let tree = fd_or_error(unsafe { libc::syscall(libc::SYS_open_tree, mounted.as_raw_fd(), name.as_ptr(), flags) }, "open_tree")?;
    let (empty, to) = (c(""), CString::new(at.as_os_str().as_bytes()).context("a path with a NUL")?);
    // SAFETY: NUL-terminated strings alive for the call.
    let rc = unsafe {
        libc::syscall(libc::SYS_move_mount, tree.as_raw_fd(), empty.as_ptr(), libc::AT_FDCWD, to.as_ptr(), MOVE_MOUNT_F_EMPTY_PATH)
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("cannot mount the copy's disk at {}", at.display()));
    }
    Ok(())
}

/// True when `p` is a mount point (another device than its parent's).
pub fn is_mount_point(p: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::symlink_metadata(p), p.parent().map(std::fs::symlink_metadata)) {
        (Ok(m), Some(Ok(parent))) => m.is_dir() && m.dev() != parent.dev(),
        _ => false,
    }
}

/// Detaches the mount at `p` (MNT_DETACH).
fn detach(p: &Path) {
    let _ = nix::mount::umount2(p, nix::mount::MntFlags::MNT_DETACH);
}

/// The mount points at or below `dir`, deepest first, from
/// /proc/self/mountinfo (its octal escapes undone).
pub fn mounts_below(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = crate::sys::procfs::mounts().into_iter().map(|m| m.point).filter(|p| p.starts_with(dir)).collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found.dedup();
    found
}

/// Detaches every mount at or below `dir` (a copy's disk, or an app's
/// scratch folder on `delete`). Quick whatever the disk holds: each mount
/// is held open first and let go on a thread of its own, so writing back
/// what the filesystem has cached happens there, not in the caller (the
/// daemon's cycle, under its lock). The loop device is freed with the
/// last mount (autoclear). Returns the threads, for tests to wait on.
pub fn detach_below(dir: &Path) -> Vec<std::thread::JoinHandle<()>> {
    let mut held = Vec::new();
    for p in mounts_below(dir) {
        let open = std::fs::File::open(&p).ok();
        detach(&p);
        held.extend(open);
    }
    if held.is_empty() {
        return Vec::new();
    }
    vec![std::thread::spawn(move || drop(held))]
}

/// What the files below some folders take on disk (their blocks), not
/// following symlinks nor crossing into another filesystem: `used` in all,
/// and `before` for the regular files last written before a time. What
/// cannot be read (gone meanwhile, another user's folder) counts as nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Every file's and folder's blocks, in bytes.
    pub used: u64,
    /// The regular files' last written before the time asked, in bytes.
    pub before: u64,
}

/// The [`Usage`] of `dirs`, `before` being the files last written before
/// `ms` (Unix ms): one walk of each.
pub fn usage(dirs: &[PathBuf], ms: u64) -> Usage {
    use std::os::unix::fs::MetadataExt;
    let mut u = Usage::default();
    for dir in dirs {
        let Ok(top) = std::fs::symlink_metadata(dir) else { continue };
        u.used += top.blocks() * 512;
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&d) else { continue };
            for e in entries.flatten() {
                let Ok(m) = e.metadata() else { continue };
                u.used += m.blocks() * 512;
                if m.is_dir() && m.dev() == top.dev() {
                    stack.push(e.path());
                } else if m.is_file() && (m.mtime().max(0) as u64) * 1000 < ms {
                    u.before += m.blocks() * 512;
                }
            }
        }
    }
    u
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The loop devices whose backing file is `image`.
    fn loops_of(image: &Path) -> Vec<String> {
        let Ok(dir) = std::fs::read_dir("/sys/block") else { return Vec::new() };
        dir.filter_map(|e| e.ok())
            .filter(|e| std::fs::read_to_string(e.path().join("loop/backing_file")).is_ok_and(|b| Path::new(b.trim()) == image))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn a_disk_has_its_size_kept_by_the_kernel_and_leaves_nothing_behind() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: loop devices and mounts need root (the integration tests cover a daemon that is not root)");
            return;
        }
        let tmp_dir = tempfile::tempdir().unwrap();
        let base = tmp_dir.path().to_path_buf();
        // Unmounted before the folder (dropped after this) is removed.
        struct Gone(PathBuf);
        impl Drop for Gone {
            fn drop(&mut self) {
                detach_below(&self.0).into_iter().for_each(|t| drop(t.join()));
            }
        }
        let dir = Gone(base);
        let dir = &dir.0;
        let scratch = dir.join("1");
        let (tmp, shm) = (dir.join("1.tmp"), dir.join("1.shm"));
        std::fs::create_dir(&scratch).unwrap();
        let got = attach(&scratch, &tmp, &shm, 32 << 20, Some((65534, 65534))).unwrap();
        assert!(matches!(got, Attached::Mounted(_)), "{got:?}");
        assert_eq!(attach(&scratch, &tmp, &shm, 32 << 20, None).unwrap(), Attached::Already);
        let image = image_path(&scratch);
        assert_eq!(loops_of(&image).len(), 1);
        use std::os::unix::fs::MetadataExt;
        for p in [&scratch, &tmp, &shm] {
            assert!(is_mount_point(p), "{}", p.display());
            assert_eq!(std::fs::metadata(p).unwrap().uid(), 65534);
        }
        // The three share the size: 20M in scratch, then 20M more in /tmp
        // cannot fit.
        std::fs::write(scratch.join("a"), vec![1u8; 20 << 20]).unwrap();
        let e = std::fs::write(tmp.join("b"), vec![1u8; 20 << 20]).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
        let host = nix::sys::statvfs::statvfs(dir).unwrap();
        let own = nix::sys::statvfs::statvfs(&shm).unwrap();
        assert!(own.blocks() * own.fragment_size() <= 32 << 20 && host.blocks() != own.blocks());
        // An empty image costs little of the host's disk.
        detach_below(dir).into_iter().for_each(|t| t.join().unwrap());
        assert!(mounts_below(dir).is_empty());
        // The kernel frees an autoclear loop device after the last unmount,
        // from a work queue: soon, not at once, on a busy machine.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !loops_of(&image).is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(loops_of(&image).is_empty(), "autoclear freed the loop device");
        let fresh = dir.join("2");
        std::fs::create_dir(&fresh).unwrap();
        attach(&fresh, &dir.join("2.tmp"), &dir.join("2.shm"), 1 << 30, None).unwrap();
        let used = std::fs::metadata(image_path(&fresh)).unwrap().blocks() * 512;
        detach_below(dir).into_iter().for_each(|t| t.join().unwrap());
        assert!(used < 8 << 20, "an empty 1G disk takes {used} bytes of the host's");
        // Files from before a disk are not hidden under one.
        let old = dir.join("3");
        std::fs::create_dir(&old).unwrap();
        std::fs::write(old.join("kept"), "x").unwrap();
        assert!(attach(&old, &dir.join("3.tmp"), &dir.join("3.shm"), 32 << 20, None).is_err());
        assert!(!is_mount_point(&old));
    }

    #[test]
    fn the_image_is_beside_the_scratch_folder() {
        assert_eq!(image_path(Path::new("/h/scratch/g-a/1")), PathBuf::from("/h/scratch/g-a/1.img"));
    }
}
