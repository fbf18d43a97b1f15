//! What `status` shows, built from the daemon's view: the roles of the last
//! cycle, the recorded copies, /proc for memory, and the load balancer's
//! traffic figures.

use crate::launcher;
use crate::model::{AppStatus, CopyStatus, StatusReport};
use crate::procfs;
use crate::reconcile::{self, Observed, Process, Seen};
use crate::release;

use super::{now_ms, Daemon};

/// The status of every app, or of one.
// A little over a screen: one pass over every app and copy that fills each
// row from the cycle's view, /proc and the load balancer's figures at once.
pub fn report(d: &Daemon, only: Option<&str>) -> Result<StatusReport, String> {
    if let Some(name) = only {
        if !d.apps.contains_key(name) {
            return Err(format!("no app named {name}; see `shinyctl status` for the apps there are"));
        }
    }
    let now = now_ms();
    let apps = d
        .apps
        .iter()
        .filter(|(n, _)| only.is_none_or(|o| o == n.as_str()))
        .map(|(name, app)| {
            let traffic = d.traffic.get(name);
            let settings = app.recorded.spec.settings_hash();
            let mut observed = Observed::default();
            let copies = app
                .recorded
                .state
                .copies
                .iter()
                .map(|rec| {
                    let alive = rec.pid.zip(rec.pid_start).is_some_and(|(p, s)| procfs::is_alive(p, s));
                    let ready = alive && rec.pid.is_some_and(|p| app.tracked.ready.contains(&p));
                    let t = traffic.and_then(|t| t.get(&rec.copy));
                    let sessions = t.map_or(0, |t| t.sessions);
                    if alive {
                        observed.copies.insert(
                            rec.copy,
                            Seen { process: Process::Running { ready }, connections: t.map_or(0, |t| t.connections), sessions },
                        );
                    }
                    let role = app.tracked.roles.iter().find(|(c, _)| *c == rec.copy).map(|(_, r)| *r).filter(|_| ready);
                    let status = if app.recorded.state.asleep_since_ms.is_some() && !alive {
                        "asleep"
                    } else if rec.left_down.is_some() {
                        "exited"
                    } else if rec.stop_started_ms.is_some() {
                        "stopping"
                    } else if rec.crashes > 0 && !ready {
                        "crash-looping"
                    } else if alive {
                        "alive"
                    } else {
                        "starting"
                    };
                    CopyStatus {
                        copy: rec.copy,
                        role,
                        copy_port: rec.port,
                        pid: rec.pid.filter(|_| alive),
                        status: status.to_string(),
                        ready,
                        mem_bytes: rec.pid.filter(|_| alive).and_then(procfs::tree_rss_bytes),
                        sessions,
                        crashes: rec.crashes,
                        started: rec.started_ms.filter(|_| alive).map(procfs::local_rfc3339),
                        outdated: rec.revision != app.recorded.state.revision || rec.settings != settings,
                        log: super::log_path(&d.home, &app.recorded.spec, rec.copy),
                        release: rec.release.clone(),
                        isolation: rec.pid.filter(|_| alive).and_then(|p| {
                            launcher::read_report(&d.home.scratch_dir(&app.recorded.spec.group, &app.recorded.spec.name, rec.copy), p)
                        }),
                    }
                })
                .collect();
            let mut notes = reconcile::notes(&app.recorded.spec, &app.recorded.state, &observed, now, &|c| {
                let path = d.home.copy_log(&app.recorded.spec.group, &app.recorded.spec.name, c);
                reconcile::CopyLog { last_error: last_error_line(&path), path: path.display().to_string() }
            });
            notes.extend(release::notes(name, &app.recorded.state, &|r| observed.copies.contains_key(&r.copy)));
            AppStatus {
                name: name.clone(),
                group: app.recorded.spec.group.clone(),
                port: app.recorded.spec.port,
                revision: app.recorded.state.revision,
                release: app.recorded.state.release.clone(),
                previous_release: app.recorded.state.previous_release.clone(),
                copies,
                notes,
            }
        })
        .collect();
    let proxy_pid = d.proxy.pid();
    Ok(StatusReport { daemon_pid: std::process::id(), proxy_pid, proxy_rss_bytes: proxy_pid.and_then(procfs::rss_bytes), apps })
}

/// The last line of R's in a copy's log that reads as an error (R writes
/// `Error…` / `Error in …`), from the log's last 16 KiB; long lines are cut.
fn last_error_line(path: &std::path::Path) -> Option<String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path).ok()?;
    let len = f.metadata().ok()?.len();
    f.seek(SeekFrom::Start(len.saturating_sub(16 * 1024))).ok()?;
    let mut tail = Vec::new();
    f.read_to_end(&mut tail).ok()?;
    let text = String::from_utf8_lossy(&tail);
    let line = text.lines().rev().find(|l| l.starts_with("Error"))?.trim();
    Some(if line.chars().count() > 200 { line.chars().take(200).chain("…".chars()).collect() } else { line.to_string() })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_last_error_line_of_a_log() {
        let dir = std::env::temp_dir().join(format!("shinyctl-lasterr-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("a.log");
        std::fs::write(&log, "--- shinyctl: copy 1 ---\nError in f(): first\nok\nError: boom\nExecution halted\n").unwrap();
        assert_eq!(super::last_error_line(&log).as_deref(), Some("Error: boom"));
        std::fs::write(&log, "Listening on http://127.0.0.1:20001\n").unwrap();
        assert_eq!(super::last_error_line(&log), None);
        assert_eq!(super::last_error_line(&dir.join("missing.log")), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
