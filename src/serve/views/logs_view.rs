//! Which log files an app's copies have (README, "Logs"), in start order:
//! the copies that ended, whose logs are still on disk, by number (a copy's
//! number is never given again, so the lower started first), then its
//! copies now, oldest start first (`logs/<group>-<app>.log` for copy 1,
//! `…@N.log` for copy N).

use crate::home::Home;
use crate::manifest::AppSpec;
use crate::wire::{AppState, CopyLogFile};

/// Every copy's log of the app.
pub fn of_app(home: &Home, spec: &AppSpec, state: &AppState) -> Vec<CopyLogFile> {
    let mut live: Vec<_> = state.copies.iter().collect();
    live.sort_by_key(|r| (r.started_ms.unwrap_or(u64::MAX), r.copy));
    let names = std::fs::read_dir(home.logs_dir())
        .map(|d| d.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect::<Vec<_>>())
        .unwrap_or_default();
    let mut ended: Vec<u32> =
        names.iter().filter_map(|n| copy_of(n, &spec.group, &spec.name)).filter(|c| !state.copies.iter().any(|r| r.copy == *c)).collect();
    ended.sort_unstable();
    let mut out: Vec<CopyLogFile> =
        ended.into_iter().map(|copy| CopyLogFile { copy, path: crate::serve::log_path(home, spec, copy), live: false }).collect();
    out.extend(live.iter().map(|r| CopyLogFile { copy: r.copy, path: crate::serve::log_path(home, spec, r.copy), live: true }));
    out
}

/// The copy whose log a file name is, for the app `group`-`name`.
fn copy_of(file: &str, group: &str, name: &str) -> Option<u32> {
    let rest = file.strip_prefix(&format!("{group}-{name}"))?.strip_suffix(".log")?;
    match rest {
        "" => Some(1),
        r => r.strip_prefix('@')?.parse().ok().filter(|&n| n > 1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_file_names_give_their_copy() {
        assert_eq!(copy_of("default-hello.log", "default", "hello"), Some(1));
        assert_eq!(copy_of("default-hello@12.log", "default", "hello"), Some(12));
        assert_eq!(copy_of("default-hello-2.log", "default", "hello"), None, "another app's");
        assert_eq!(copy_of("default-hello@x.log", "default", "hello"), None);
        assert_eq!(copy_of("default-hello.log.1", "default", "hello"), None);
    }
}
