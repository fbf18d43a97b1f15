//! Mounts, as `/proc/self/mountinfo` lists them.

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use procfs::process::MountInfo;

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
