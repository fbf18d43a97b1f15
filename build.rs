//! Gives each build of different sources its own identity
//! (`SHINYCTL_BUILD_ID`, a hash of `src/`, Cargo.toml and Cargo.lock), so a
//! new daemon can tell a load balancer of another build and replace it.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::Path;

fn hash_tree(dir: &Path, h: &mut DefaultHasher) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut paths: Vec<_> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    for path in paths {
        if path.is_dir() {
            hash_tree(&path, h);
        } else if let Ok(bytes) = std::fs::read(&path) {
            path.to_string_lossy().hash(h);
            bytes.hash(h);
        }
    }
}

fn main() {
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=Cargo.toml");
    println!("cargo:rerun-if-changed=Cargo.lock");
    let mut h = DefaultHasher::new();
    hash_tree(Path::new("src"), &mut h);
    for f in ["Cargo.toml", "Cargo.lock"] {
        if let Ok(bytes) = std::fs::read(f) {
            bytes.hash(&mut h);
        }
    }
    println!("cargo:rustc-env=SHINYCTL_BUILD_ID={:016x}", h.finish());
}
