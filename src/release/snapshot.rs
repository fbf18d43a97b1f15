//! Taking a snapshot of an app's working-dir: its size is checked first
//! (nothing over the limit is copied), then it is copied into a hidden
//! folder beside where it will live, and renamed into place only when whole
//! ([`Pending::commit`]). A snapshot that fails, or is dropped before its
//! commit, leaves nothing behind.
//!
//! Files are copied with `std::fs::copy`, which uses `copy_file_range` on
//! Linux: on XFS and btrfs the kernel clones the extents (the copy takes no
//! room until one side changes), elsewhere it copies in the kernel. Symlinks
//! stay symlinks (an renv library points into its cache). Never hard links:
//! an editor that writes in place would change the release with them.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::sys::fmt::{size, SizeStyle};

/// Left out of every release, by name, at any depth: version control
/// (history the app never reads, often larger than the app), RStudio's
/// per-user state (caches, open tabs) and console history (it may hold
/// secrets typed at the console).
pub const LEFT_OUT_NAMES: [&str; 5] = [".git", ".hg", ".svn", ".Rproj.user", ".Rhistory"];

/// How many of the largest entries a refusal names.
const LARGEST_SHOWN: usize = 5;

/// What to copy and what to leave out.
#[derive(Debug, Clone)]
pub struct Source {
    /// The folder to snapshot (working-dir).
    pub dir: PathBuf,
    /// Paths left out besides [`LEFT_OUT_NAMES`]: the state-file (and the
    /// temporary files it is written through), `$SHINYCTL_HOME` when it
    /// lies inside working-dir.
    pub leave_out: Vec<PathBuf>,
}

/// A snapshot copied into its hidden folder, not yet in place. Dropping it
/// without [`Pending::commit`] removes the copy.
#[derive(Debug)]
pub struct Pending {
    /// The hidden folder holding the copy.
    tmp: PathBuf,
    /// Where it goes on commit.
    dest: PathBuf,
    /// Bytes copied (the files' sizes; what the disk holds may be less
    /// where extents are shared).
    pub bytes: u64,
    /// Files and symlinks copied.
    pub files: u64,
    /// How long the size check and the copy took.
    pub took: Duration,
    /// Renamed into place: nothing to remove on drop.
    committed: bool,
}

impl Pending {
    /// The folder the snapshot will have once committed.
    pub fn dest(&self) -> &Path {
        &self.dest
    }

    /// Renames the copy into place (atomic: the folder is whole or absent).
    pub fn commit(mut self) -> io::Result<PathBuf> {
        fs::rename(&self.tmp, &self.dest)?;
        self.committed = true;
        Ok(self.dest.clone())
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.committed {
            let _ = fs::remove_dir_all(&self.tmp);
        }
    }
}

/// The hidden folder a snapshot for `dest` is copied into first.
pub fn partial_path(dest: &Path) -> PathBuf {
    let name = dest.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    dest.with_file_name(format!(".{name}.partial"))
}

/// Why a snapshot could not be taken; each message is one line for a person.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// working-dir cannot be read.
    #[error("cannot read working-dir {}: {source}", .dir.display())]
    WorkingDir {
        /// working-dir as the manifest gives it.
        dir: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// working-dir is not a folder.
    #[error("working-dir {} is not a folder", .0.display())]
    NotAFolder(PathBuf),
    /// working-dir holds more than a release may (the message names its
    /// largest entries and what to do).
    #[error("{0}")]
    TooLarge(String),
    /// The release's folder has no parent.
    #[error("{} has no parent folder", .0.display())]
    NoParent(PathBuf),
    /// A file or folder could not be read, made or copied.
    #[error("cannot {what} {}: {source}", .path.display())]
    Io {
        /// What was being done ("read", "create", "copy" …).
        what: &'static str,
        /// To which path.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
}

/// The error of `what` (such as "read") failing on `path`.
fn io_error<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> SnapshotError + 'a {
    move |source| SnapshotError::Io { what, path: path.to_path_buf(), source }
}

/// Takes a snapshot of `src` for `dest` (which must not exist yet): refuses
/// a working-dir larger than `limit` bytes, naming its largest entries;
/// any failure removes what was copied. The error is one line for a person.
pub fn take(src: &Source, dest: &Path, limit: u64) -> Result<Pending, SnapshotError> {
    let started = Instant::now();
    let root = src.dir.canonicalize().map_err(|source| SnapshotError::WorkingDir { dir: src.dir.clone(), source })?;
    if !root.is_dir() {
        return Err(SnapshotError::NotAFolder(src.dir.clone()));
    }
    let walk = Walk { leave_out: src.leave_out.iter().map(|p| canonical_or_same(p)).collect(), root: root.clone() };
    let sizes = walk.top_sizes(&root)?;
    let total: u64 = sizes.iter().map(|(_, s)| s).sum();
    if total > limit {
        return Err(SnapshotError::TooLarge(too_large(&src.dir, total, limit, sizes)));
    }
    let parent = dest.parent().ok_or_else(|| SnapshotError::NoParent(dest.to_path_buf()))?;
    fs::create_dir_all(parent).map_err(io_error("create", parent))?;
    let mut pending =
        Pending { tmp: partial_path(dest), dest: dest.to_path_buf(), bytes: 0, files: 0, took: Duration::ZERO, committed: false };
    // A partial copy left by a daemon that died while taking it.
    let _ = fs::remove_dir_all(&pending.tmp);
    let mut count = Count::default();
    walk.copy_dir(&root, &pending.tmp, &mut count)?;
    pending.bytes = count.bytes;
    pending.files = count.files;
    pending.took = started.elapsed();
    Ok(pending)
}

/// Copies one file: `std::fs::copy` (copy_file_range, mode and all), but a
/// sparse file (fewer blocks than its length takes) by its data alone, so
/// its holes stay holes: copy_file_range writes them out as zeros on most
/// filesystems, and a 1.5 GB sparse file with 51 MB of data took 1.6 GB a
/// release. Returns the file's length, as `fs::copy` does.
fn copy_file(from: &Path, to: &Path) -> io::Result<u64> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;
    let meta = fs::metadata(from)?;
    if meta.blocks() * 512 >= meta.len() {
        return fs::copy(from, to);
    }
    let src = fs::File::open(from)?;
    let dst = fs::File::create(to)?;
    dst.set_len(meta.len())?;
    let mut at: i64 = 0;
    let len = meta.len() as i64;
    while at < len {
        // The next run of data, and where it ends (ENXIO: no data after).
        let data = match nix::unistd::lseek(src.as_raw_fd(), at, nix::unistd::Whence::SeekData) {
            Ok(d) => d,
            Err(nix::errno::Errno::ENXIO) => break,
            Err(e) => return Err(e.into()),
        };
        let hole = nix::unistd::lseek(src.as_raw_fd(), data, nix::unistd::Whence::SeekHole)?;
        copy_range(&src, &dst, data as u64, (hole - data) as u64)?;
        at = hole;
    }
    dst.set_permissions(meta.permissions())?;
    Ok(meta.len())
}

/// Copies `n` bytes at `offset` of `src` to the same offset of `dst`.
fn copy_range(src: &fs::File, dst: &fs::File, offset: u64, n: u64) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; 1 << 20];
    let mut done = 0;
    while done < n {
        let want = (n - done).min(buf.len() as u64) as usize;
        let got = src.read_at(&mut buf[..want], offset + done)?;
        if got == 0 {
            break;
        }
        dst.write_all_at(&buf[..got], offset + done)?;
        done += got as u64;
    }
    Ok(())
}

/// The refusal of a working-dir over the limit.
fn too_large(dir: &Path, total: u64, limit: u64, mut sizes: Vec<(String, u64)>) -> String {
    sizes.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let largest: Vec<String> = sizes.iter().take(LARGEST_SHOWN).map(|(n, s)| format!("{n} ({})", size(*s, SizeStyle::Prose))).collect();
    format!(
        "working-dir {} holds {}, more than the {} a release may hold (each deploy copies it). Its largest entries: {}. \
         Keep data outside working-dir and give the app its path in `env` (such as `DATA_DIR: /srv/data`, read with \
         Sys.getenv(\"DATA_DIR\")), or point working-dir at a folder with only the app's code",
        dir.display(),
        size(total, SizeStyle::Prose),
        size(limit, SizeStyle::Prose),
        largest.join(", ")
    )
}

/// The path made canonical through its parent (the file itself may not
/// exist yet, as a state-file before its first write).
fn canonical_or_same(p: &Path) -> PathBuf {
    if let Ok(c) = p.canonicalize() {
        return c;
    }
    match (p.parent().and_then(|d| d.canonicalize().ok()), p.file_name()) {
        (Some(d), Some(n)) => d.join(n),
        _ => p.to_path_buf(),
    }
}

/// What has been copied so far.
#[derive(Debug, Default)]
struct Count {
    bytes: u64,
    files: u64,
}

/// The rules of one walk over working-dir.
struct Walk {
    /// Canonical paths left out.
    leave_out: HashSet<PathBuf>,
    /// working-dir, canonical.
    root: PathBuf,
}

impl Walk {
    /// True for an entry that is not part of a release. The state-file is
    /// written through `.<name>.tmp.<pid>` beside it: those go too.
    fn left_out(&self, path: &Path, name: &str) -> bool {
        if LEFT_OUT_NAMES.contains(&name) || self.leave_out.contains(path) {
            return true;
        }
        self.leave_out.iter().any(|p| {
            p.parent() == path.parent() && p.file_name().is_some_and(|f| name.starts_with(&format!(".{}.tmp.", f.to_string_lossy())))
        })
    }

    /// The entries of a folder that belong in the release, with their names.
    fn entries(&self, dir: &Path) -> Result<Vec<(PathBuf, String, fs::FileType)>, SnapshotError> {
        let read = fs::read_dir(dir).map_err(io_error("read", dir))?;
        let mut out = Vec::new();
        for entry in read {
            let entry = entry.map_err(io_error("read", dir))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            if self.left_out(&path, &name) {
                continue;
            }
            match entry.file_type() {
                Ok(t) => out.push((path, name, t)),
                // Gone since the folder was read (a temporary file).
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_error("read", &path)(e)),
            }
        }
        Ok(out)
    }

    /// The size of each top-level entry (folders summed, symlinks not
    /// followed).
    fn top_sizes(&self, root: &Path) -> Result<Vec<(String, u64)>, SnapshotError> {
        self.entries(root)?
            .into_iter()
            .map(|(path, name, t)| {
                let size = self.size(&path, t)?;
                Ok((if t.is_dir() { format!("{name}/") } else { name }, size))
            })
            .collect()
    }

    fn size(&self, path: &Path, t: fs::FileType) -> Result<u64, SnapshotError> {
        if t.is_dir() {
            let mut sum = 0;
            for (p, _, t) in self.entries(path)? {
                sum += self.size(&p, t)?;
            }
            Ok(sum)
        } else if t.is_file() {
            match fs::symlink_metadata(path) {
                Ok(m) => Ok(m.len()),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
                Err(e) => Err(io_error("read", path)(e)),
            }
        } else {
            Ok(0)
        }
    }

    /// What symlink `link` (pointing at `target`) points at in the release:
    /// the same, unless it is relative and leads out of working-dir (a
    /// shared folder beside the app, `../shared`), which the release's own
    /// place would break: then the absolute path it leads to now, as R
    /// started in working-dir would have found it. A link that leads
    /// nowhere stays as it is.
    fn link_in_release(&self, link: &Path, target: PathBuf) -> PathBuf {
        if target.is_absolute() {
            return target;
        }
        match fs::canonicalize(link) {
            Ok(real) if !real.starts_with(&self.root) => real,
            _ => target,
        }
    }

    /// Copies a folder's release entries into `dst` (created here), then
    /// gives `dst` the mode of `src` (last, so a read-only folder can be
    /// filled first).
    fn copy_dir(&self, src: &Path, dst: &Path, count: &mut Count) -> Result<(), SnapshotError> {
        fs::create_dir(dst).map_err(io_error("create", dst))?;
        for (path, name, t) in self.entries(src)? {
            let to = dst.join(&name);
            if t.is_dir() {
                self.copy_dir(&path, &to, count)?;
            } else if t.is_symlink() {
                let target = match fs::read_link(&path) {
                    Ok(t) => t,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(io_error("read the symlink", &path)(e)),
                };
                let target = self.link_in_release(&path, target);
                std::os::unix::fs::symlink(&target, &to).map_err(io_error("create the symlink", &to))?;
                count.files += 1;
            } else if t.is_file() {
                match copy_file(&path, &to) {
                    Ok(n) => {
                        count.bytes += n;
                        count.files += 1;
                    }
                    Err(e) if e.kind() == io::ErrorKind::NotFound && !path.exists() => continue,
                    Err(e) => return Err(io_error("copy", &path)(e)),
                }
            }
            // Sockets, FIFOs and devices are not part of an app's code.
        }
        let mode = fs::metadata(src).map_err(io_error("read", src))?.permissions();
        fs::set_permissions(dst, mode).map_err(io_error("set the mode of", dst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A temporary folder: its path, and the folder (removed when dropped;
    /// held only for that).
    struct Tmp(PathBuf, #[allow(dead_code)] tempfile::TempDir);
    impl Tmp {
        fn new(name: &str) -> Tmp {
            let dir = tempfile::Builder::new().prefix(&format!("shinyctl-snap-{name}-")).tempdir().unwrap();
            Tmp(dir.path().to_path_buf(), dir)
        }
    }

    fn source(dir: &Path, leave_out: &[PathBuf]) -> Source {
        Source { dir: dir.to_path_buf(), leave_out: leave_out.to_vec() }
    }

    /// Every path under `dir`, relative, sorted (folders with a trailing /).
    fn listing(dir: &Path) -> Vec<String> {
        fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
            for e in fs::read_dir(dir).unwrap() {
                let e = e.unwrap();
                let rel = e.path().strip_prefix(base).unwrap().to_string_lossy().into_owned();
                if e.file_type().unwrap().is_dir() {
                    out.push(format!("{rel}/"));
                    walk(base, &e.path(), out);
                } else {
                    out.push(rel);
                }
            }
        }
        let mut out = Vec::new();
        walk(dir, dir, &mut out);
        out.sort();
        out
    }

    #[test]
    fn a_sparse_file_stays_sparse_in_the_release() {
        use std::os::unix::fs::{FileExt, MetadataExt};
        let t = Tmp::new("sparse");
        let app = t.0.join("app");
        fs::create_dir_all(&app).unwrap();
        let f = fs::File::create(app.join("big.db")).unwrap();
        f.set_len(200 << 20).unwrap();
        f.write_all_at(b"head", 0).unwrap();
        f.write_all_at(b"middle", 100 << 20).unwrap();
        f.write_all_at(b"tail", (200 << 20) - 4).unwrap();
        drop(f);
        let dir = take(&source(&app, &[]), &t.0.join("releases/r1"), 1 << 30).unwrap().commit().unwrap();
        let (src, copy) = (fs::read(app.join("big.db")).unwrap(), fs::read(dir.join("big.db")).unwrap());
        assert!(src == copy, "the same bytes");
        let used = fs::metadata(dir.join("big.db")).unwrap().blocks() * 512;
        assert!(used < 4 << 20, "its holes stay holes: {used} bytes on disk");
    }

    #[test]
    fn a_relative_symlink_out_of_working_dir_points_where_it_led() {
        // `app/shared -> ../shared`: from the release's own place it would
        // lead nowhere; R started in working-dir would have found it.
        let t = Tmp::new("linkout");
        let app = t.0.join("app");
        fs::create_dir_all(&app).unwrap();
        fs::create_dir_all(t.0.join("shared")).unwrap();
        fs::write(t.0.join("shared/data.csv"), "x,y").unwrap();
        std::os::unix::fs::symlink("../shared", app.join("shared")).unwrap();
        let dir = take(&source(&app, &[]), &t.0.join("releases/r1"), 1 << 20).unwrap().commit().unwrap();
        assert_eq!(fs::read_link(dir.join("shared")).unwrap(), t.0.join("shared").canonicalize().unwrap());
        assert_eq!(fs::read_to_string(dir.join("shared/data.csv")).unwrap(), "x,y");
    }

    #[test]
    fn copies_files_and_folders_keeps_symlinks_and_leaves_out_vcs_and_the_state_file() {
        let t = Tmp::new("copy");
        let app = t.0.join("app");
        fs::create_dir_all(app.join("R")).unwrap();
        fs::create_dir_all(app.join(".git/objects")).unwrap();
        fs::create_dir_all(app.join("sub/.Rproj.user")).unwrap();
        fs::write(app.join("app.R"), "v1").unwrap();
        fs::write(app.join("R/helpers.R"), "h").unwrap();
        fs::write(app.join(".git/HEAD"), "ref").unwrap();
        fs::write(app.join("sub/.Rhistory"), "secret").unwrap();
        fs::write(app.join("state.json"), "{}").unwrap();
        fs::write(app.join(".state.json.tmp.123"), "{}").unwrap();
        fs::write(app.join("state.json.synced"), "{}").unwrap();
        fs::write(app.join(".state.json.synced.tmp.123.4"), "{}").unwrap();
        std::os::unix::fs::symlink("/nonexistent/renv/cache", app.join("renv-lib")).unwrap();
        std::os::unix::fs::symlink("R/helpers.R", app.join("helpers.R")).unwrap();
        fs::set_permissions(app.join("app.R"), fs::Permissions::from_mode(0o640)).unwrap();

        let dest = t.0.join("releases/r1");
        let pending = take(&source(&app, &[app.join("state.json"), app.join("state.json.synced")]), &dest, 1 << 20).unwrap();
        assert!(!dest.exists(), "nothing is in place before the commit");
        assert_eq!((pending.bytes, pending.files), (3, 4), "v1 + h, plus two symlinks");
        let dir = pending.commit().unwrap();
        assert_eq!(listing(&dir), ["R/", "R/helpers.R", "app.R", "helpers.R", "renv-lib", "sub/"]);
        assert_eq!(
            fs::read_link(dir.join("renv-lib")).unwrap(),
            Path::new("/nonexistent/renv/cache"),
            "a dangling symlink is kept as it is"
        );
        assert_eq!(fs::read_to_string(dir.join("helpers.R")).unwrap(), "h", "a relative symlink points inside the release");
        assert_eq!(fs::read_link(dir.join("helpers.R")).unwrap(), Path::new("R/helpers.R"), "and stays relative");
        assert_eq!(fs::metadata(dir.join("app.R")).unwrap().permissions().mode() & 0o777, 0o640);

        fs::write(app.join("app.R"), "v2").unwrap();
        assert_eq!(fs::read_to_string(dir.join("app.R")).unwrap(), "v1", "not a hard link: an edit in place leaves the release alone");
        assert!(!partial_path(&dest).exists());
    }

    #[test]
    fn a_working_dir_over_the_limit_is_refused_naming_its_largest_entries() {
        let t = Tmp::new("limit");
        let app = t.0.join("app");
        fs::create_dir_all(app.join("data/deep")).unwrap();
        fs::create_dir_all(app.join(".git")).unwrap();
        fs::write(app.join("app.R"), vec![b'x'; 100]).unwrap();
        fs::write(app.join("data/deep/big.csv"), vec![b'x'; 3000]).unwrap();
        fs::write(app.join("notes.txt"), vec![b'x'; 1000]).unwrap();
        fs::write(app.join(".git/pack"), vec![b'x'; 100_000]).unwrap();

        let dest = t.0.join("releases/r1");
        let err = take(&source(&app, &[]), &dest, 4000).unwrap_err().to_string();
        assert!(err.contains("holds 4.0 KiB, more than the 3.9 KiB a release may hold"), "{err}");
        assert!(err.contains("Its largest entries: data/ (2.9 KiB), notes.txt (1000 B), app.R (100 B)."), "{err}");
        assert!(err.contains("Keep data outside working-dir") && err.contains("`env`"), "{err}");
        assert!(!dest.exists() && !partial_path(&dest).exists(), "nothing was copied");

        // What is left out does not count: .git alone is over the limit.
        assert!(take(&source(&app, &[]), &dest, 4100).is_ok());
    }

    #[test]
    fn a_failed_copy_leaves_nothing_behind() {
        let t = Tmp::new("fail");
        let app = t.0.join("app");
        fs::create_dir_all(&app).unwrap();
        fs::write(app.join("app.R"), "1").unwrap();
        // A path that fits under working-dir but not under the (longer)
        // partial folder: the copy fails midway, whoever runs the test.
        // (PATH_MAX is 4096; the partial folder's path is 17 bytes longer.)
        let mut deep = app.clone();
        while deep.as_os_str().len() + 201 < 4085 {
            deep.push("d".repeat(200));
        }
        deep.push("e".repeat(4085 - 1 - deep.as_os_str().len()));
        fs::create_dir_all(&deep).unwrap();
        fs::write(deep.join("x.R"), "2").unwrap();
        let dest = t.0.join("releases/r1");
        let err = take(&source(&app, &[]), &dest, 1 << 20).unwrap_err().to_string();
        assert!(err.starts_with("cannot create") && err.contains("File name too long"), "{err}");
        assert!(!partial_path(&dest).exists(), "the partial copy is removed");
        assert!(!dest.exists());
    }

    #[test]
    fn a_full_disk_refuses_the_release_and_leaves_nothing() {
        if !needs_root("mounting a small tmpfs to fill") {
            return;
        }
        let t = Tmp::new("full");
        let app = t.0.join("app");
        fs::create_dir_all(&app).unwrap();
        fs::write(app.join("app.R"), "1").unwrap();
        fs::write(app.join("data.bin"), vec![7u8; 512 << 10]).unwrap();
        let small = t.0.join("small");
        fs::create_dir_all(&small).unwrap();
        let status = std::process::Command::new("mount").args(["-t", "tmpfs", "-o", "size=256k", "tmpfs"]).arg(&small).status().unwrap();
        assert!(status.success(), "mount a 256k tmpfs");
        let _unmount = Unmount(small.clone());
        let dest = small.join("releases/r1");
        let err = take(&source(&app, &[]), &dest, 1 << 30).unwrap_err().to_string();
        assert!(err.contains("No space left on device"), "{err}");
        assert!(listing(&small.join("releases")).is_empty(), "the partial copy is removed");
    }

    /// For a test that needs root: true as root; when not, false (printing
    /// SKIPPED) if `SHINYCTL_TEST_NOT_ROOT=1` says this run knows, else a
    /// panic: CI runs the tests as root, and a skip there would go unseen.
    fn needs_root(why: &str) -> bool {
        if nix::unistd::geteuid().is_root() {
            return true;
        }
        assert!(
            std::env::var("SHINYCTL_TEST_NOT_ROOT").is_ok_and(|v| v == "1"),
            "this test needs root ({why}); set SHINYCTL_TEST_NOT_ROOT=1 to skip it knowingly"
        );
        eprintln!("SKIPPED: not root ({why}) and SHINYCTL_TEST_NOT_ROOT=1");
        false
    }

    #[test]
    fn an_unreadable_file_refuses_the_release_and_leaves_nothing() {
        if nix::unistd::geteuid().is_root() {
            // Root reads a file of mode 000: the check runs in a child of
            // this test binary that drops to `nobody`.
            use std::os::unix::process::CommandExt;
            let name = "release::snapshot::tests::an_unreadable_file_refuses_the_release_and_leaves_nothing";
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", name, "--test-threads=1"])
                .uid(65534)
                .gid(65534)
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success() && text.contains("1 passed"),
                "the check as nobody:\n{text}{}",
                String::from_utf8_lossy(&out.stderr)
            );
            return;
        }
        let t = Tmp::new("unreadable");
        let app = t.0.join("app");
        fs::create_dir_all(&app).unwrap();
        fs::write(app.join("app.R"), "1").unwrap();
        fs::write(app.join("secret.R"), "2").unwrap();
        fs::set_permissions(app.join("secret.R"), fs::Permissions::from_mode(0o000)).unwrap();
        let dest = t.0.join("releases/r1");
        let err = take(&source(&app, &[]), &dest, 1 << 20).unwrap_err().to_string();
        assert!(err.contains("secret.R") && err.contains("Permission denied"), "{err}");
        assert!(!partial_path(&dest).exists() && !dest.exists());
    }

    /// Unmounts a test's filesystem when dropped.
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }

    #[test]
    fn a_dropped_snapshot_is_removed_and_a_stale_partial_copy_is_replaced() {
        let t = Tmp::new("drop");
        let app = t.0.join("app");
        fs::create_dir_all(&app).unwrap();
        fs::write(app.join("app.R"), "1").unwrap();
        let dest = t.0.join("releases/r1");
        fs::create_dir_all(partial_path(&dest).join("junk")).unwrap();
        let pending = take(&source(&app, &[]), &dest, 1 << 20).unwrap();
        assert_eq!(listing(&partial_path(&dest)), ["app.R"], "the stale partial copy was replaced");
        drop(pending);
        assert!(!partial_path(&dest).exists());
    }
}
