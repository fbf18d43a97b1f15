//! What `status` shows, built from the daemon's view: the roles of the last
//! cycle, the recorded copies, what /proc and the launchers' reports say
//! (looked up before, with the lock released: `probe::ShownCopies`), and
//! the load balancer's traffic figures.

use std::collections::HashMap;

use crate::reconcile::{self, Observed, ObservedCopy, Process};
use crate::release;
use crate::sys::procfs;
use crate::wire::{AppStatus, CopyStatus, CopyTraffic, Refusing, StatusReport};

use crate::serve::app::AppRt;
use crate::serve::copies::probe::{ShownCopies, ShownProcess};
use crate::serve::error::ServeError;
use crate::serve::now_ms;
use crate::serve::Daemon;
use crate::serve::Shared;

/// Logs (api.log) the fences a copy that became ready is missing, with the
/// reason and the fix.
pub fn log_missing_fences(d: &Daemon, app: &str, pid: u32) {
    let Some(a) = d.apps.get(app) else { return };
    let Some(rec) = a.recorded.state.copies.iter().find(|r| r.pid == Some(pid)) else { return };
    let scratch = d.home.scratch_dir(&a.recorded.spec.group, &a.recorded.spec.name, rec.copy);
    let Some(report) = crate::wire::launch::report::read_report(&scratch, pid) else { return };
    for f in report.isolation.missing() {
        let (reason, fix) = (f.reason.as_deref().unwrap_or("-"), f.fix.as_deref().unwrap_or("-"));
        tracing::warn!(app, copy = rec.copy, fence = f.name.as_str(), reason, fix, "the copy runs without this fence");
    }
}

/// What status shows of the processes of app `only` (or of every app),
/// looked up with the daemon's lock released.
pub async fn look_up(shared: &Shared, only: Option<&str>) -> ShownCopies {
    let probes = {
        let d = shared.lock();
        let names: Vec<String> = d.apps.keys().filter(|n| only.is_none_or(|o| o == n.as_str())).cloned().collect();
        d.probes(&names)
    };
    tokio::task::spawn_blocking(move || ShownCopies::find(probes)).await.unwrap_or_default()
}

impl Daemon {
    /// `GET /v1/status`: what status shows of app `only` (or of every app),
    /// the load balancer's figures `stats` (fetched with the lock released)
    /// folded in first.
    pub(in crate::serve) fn status_view(
        &mut self,
        only: Option<&str>,
        shown: &ShownCopies,
        stats: Option<crate::wire::ProxyStats>,
    ) -> Result<StatusReport, ServeError> {
        if let Some(stats) = stats {
            self.fold_traffic(stats);
        }
        report(self, only, shown)
    }

    /// `GET /v1/apps/NAME/releases`: the app's kept releases.
    pub(in crate::serve) fn releases_view(&self, name: &str) -> Result<Vec<crate::wire::ReleaseRow>, ServeError> {
        let app = self.apps.get(name).ok_or_else(|| ServeError::NoSuchApp(name.to_string()))?;
        Ok(release::rows(&app.recorded.state))
    }

    /// `GET /v1/apps/NAME/logs[?copy=N]`: the app's logs, and the path of
    /// copy N's (or of the first copy's).
    pub(in crate::serve) fn logs_view(&self, name: &str, copy: Option<u32>) -> Result<crate::wire::LogsReply, ServeError> {
        let app = self.apps.get(name).ok_or_else(|| ServeError::NoSuchApp(name.to_string()))?;
        let (home, spec) = (&self.home, &app.recorded.spec);
        let copies = crate::serve::views::logs_view::of_app(home, spec, &app.recorded.state);
        let path = match copy {
            Some(n) => crate::serve::log_path(home, spec, n),
            None => copies.first().map(|c| c.path.clone()).unwrap_or_else(|| crate::serve::log_path(home, spec, 1)),
        };
        Ok(crate::wire::LogsReply { path, copies })
    }

    /// `GET /v1/apps/NAME/rollout?revision=N`: how the deploy at `revision`
    /// goes (what `--wait` follows); failed once the app is deleted.
    pub(in crate::serve) fn rollout_view(&self, name: &str, revision: u64) -> crate::wire::RolloutReply {
        let Some(app) = self.apps.get(name).filter(|a| !a.recorded.deleting) else {
            return crate::wire::RolloutReply {
                state: crate::wire::RolloutState::Failed,
                message: format!("{name} was deleted"),
                before_serves: Some(false),
            };
        };
        let (spec, state) = (&app.recorded.spec, &app.recorded.state);
        reconcile::rollout(state, &spec.settings_hash(), spec.scale.replicas, &app.tracked.roles, revision, now_ms())
    }
}

/// The status of every app, or of one.
pub fn report(d: &Daemon, only: Option<&str>, shown: &ShownCopies) -> Result<StatusReport, ServeError> {
    if let Some(name) = only {
        if !d.apps.contains_key(name) {
            return Err(ServeError::NoSuchApp(name.to_string()));
        }
    }
    let now = now_ms();
    let apps = d
        .apps
        .iter()
        .filter(|(n, _)| only.is_none_or(|o| o == n.as_str()))
        .map(|(name, app)| app_status(d, name, app, shown, now))
        .collect();
    let proxy_pid = d.proxy_pid;
    Ok(StatusReport {
        daemon_pid: std::process::id(),
        proxy_pid,
        proxy_rss_bytes: proxy_pid.and_then(procfs::rss_bytes),
        own_user: crate::serve::views::identity_notes::own_user_note(d.apps.values().map(|a| &a.recorded.spec)),
        apps,
        limits: Some(crate::serve::watches::memory::limits_report(&d.cgroups)),
        pool: Some(crate::serve::copies::zygote_pool::report()),
    })
}

/// One app's status: each copy's row, filled from the cycle's view, /proc
/// and the load balancer's figures at once, then the lines under its table.
fn app_status(d: &Daemon, name: &str, app: &AppRt, shown: &ShownCopies, now: u64) -> AppStatus {
    let view = AppView { d, name, app, traffic: d.traffic.get(name), settings: app.recorded.spec.settings_hash(), now };
    let mut observed = Observed::default();
    let copies: Vec<CopyStatus> = app.recorded.state.copies.iter().map(|rec| copy_status(&view, rec, shown, &mut observed)).collect();
    let not_listening = d.sockets.failure(app.recorded.spec.route.port).map(str::to_string);
    let capacity = reconcile::capacity::status(&app.recorded.spec, &app.recorded.state, &app.tracked.roles, |c| {
        view.traffic.and_then(|t| t.get(&c)).map_or(0, |t| t.sessions)
    });
    let notes = app_notes(&view, &observed, &copies, not_listening.as_deref(), &capacity);
    AppStatus {
        name: name.to_string(),
        group: app.recorded.spec.group.clone(),
        port: app.recorded.spec.route.port,
        revision: app.recorded.state.revision,
        release: app.recorded.state.release.clone(),
        previous_release: app.recorded.state.previous_release.clone(),
        not_listening,
        copies,
        notes,
        runs_as_root: root_note(&app.recorded.spec, nix::unistd::geteuid().is_root()),
        uid: app.recorded.state.uid.filter(|_| crate::serve::copies::act::runs_as_own_uid(&app.recorded.spec)),
        state: app_state(&app.recorded).to_string(),
        replicas: app.recorded.spec.scale.replicas,
        manifest: app.recorded.spec.manifest.display().to_string(),
        capacity: Some(capacity),
    }
}

/// What an app's rows and lines are made from, read once for the app.
struct AppView<'a> {
    d: &'a Daemon,
    name: &'a str,
    app: &'a AppRt,
    /// The load balancer's figures for its copies.
    traffic: Option<&'a HashMap<u32, CopyTraffic>>,
    /// How it starts now (`settings_hash`): a copy started otherwise is outdated.
    settings: String,
    now: u64,
}

/// One copy's row; a copy whose process runs is added to `observed`, which
/// the lines under the table read as `decide` reads it.
fn copy_status(view: &AppView, rec: &crate::wire::CopyRecord, shown: &ShownCopies, observed: &mut Observed) -> CopyStatus {
    let AppView { d, app, traffic, now, .. } = *view;
    let scratch = d.home.scratch_dir(&app.recorded.spec.group, &app.recorded.spec.name, rec.copy);
    let ShownProcess { alive, report, mem_bytes, cpu_secs } = rec.pid.map(|p| shown.get(p, rec.pid_start, &scratch)).unwrap_or_default();
    let ready = alive && rec.pid.is_some_and(|p| app.tracked.process(p).ready);
    let t = traffic.and_then(|t| t.get(&rec.copy));
    let sessions = t.map_or(0, |t| t.sessions);
    if alive {
        observed
            .copies
            .insert(rec.copy, ObservedCopy { process: Process::Running { ready }, connections: t.map_or(0, |t| t.connections), sessions });
    }
    let role = app.tracked.roles.iter().find(|(c, _)| *c == rec.copy).map(|(_, r)| *r).filter(|_| ready);
    let status = if app.recorded.state.asleep_since_ms.is_some() && !alive {
        "asleep"
    } else if rec.left_down.as_deref().is_some_and(|w| w.starts_with(crate::wire::REFUSED)) {
        "refused"
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
    let running = rec.pid.filter(|_| alive);
    CopyStatus {
        copy: rec.copy,
        role,
        copy_port: rec.port,
        // R's, once its launcher has reported it (every launcher forks R):
        // none while the copy is still being made.
        pid: running.and_then(|_| report.as_ref().and_then(|r| r.r_pid)),
        launcher_pid: running,
        status: status.to_string(),
        ready,
        // The sampler's proportional share; the resident memory just read
        // for a copy it has not read yet.
        mem_bytes: running.and_then(|p| d.copy_mem.get(&p).copied()).or(mem_bytes),
        sessions,
        crashes: rec.crashes,
        started: rec.started_ms.filter(|_| alive).map(procfs::local_rfc3339),
        outdated: rec.revision != app.recorded.state.revision || rec.settings != view.settings,
        log: crate::serve::log_path(&d.home, &app.recorded.spec, rec.copy),
        release: rec.release.clone(),
        isolation: report.map(|r| r.isolation),
        started_ms: rec.started_ms.filter(|_| alive),
        uptime_secs: rec.started_ms.filter(|_| alive).map(|s| now.saturating_sub(s) / 1000),
        cpu_secs,
        cpu_percent: running.and_then(|p| d.cpu_percent.get(p, rec.pid_start)),
        memory_limit_bytes: memory_limit(&app.recorded, rec),
        disk_bytes: disk_size(&app.recorded, rec),
        disk_own_filesystem: crate::sys::disk::is_mount_point(&scratch),
    }
}

/// The lines under an app's table: `decide`'s notes, then the releases',
/// the fence's, the state file's, the load balancer's, the port's, the
/// memory limits', the identity's and capacity's.
fn app_notes(
    view: &AppView,
    observed: &Observed,
    copies: &[CopyStatus],
    not_listening: Option<&str>,
    capacity: &crate::wire::CapacityStatus,
) -> Vec<String> {
    let AppView { d, name, app, traffic, now, .. } = *view;
    let mut notes = reconcile::notes(&app.recorded.spec, &app.recorded.state, observed, now, &|c| {
        let path = d.home.copy_log(&app.recorded.spec.group, &app.recorded.spec.name, c);
        reconcile::CopyLog { last_error: last_error_line(&path), path: path.display().to_string() }
    });
    notes.extend(release::notes(name, &app.recorded.state, &|r| observed.copies.contains_key(&r.copy)));
    let fenced: Vec<(u32, &crate::wire::Isolation)> = copies.iter().filter_map(|c| Some((c.copy, c.isolation.as_ref()?))).collect();
    notes.extend(crate::wire::launch::fences::notes(name, &app.recorded.spec.start.sandbox, &fenced));
    if let Some(why) = &app.tracked.state_error {
        notes.push(format!(
            "{name}: cannot write its state file {}: {why}; the previous one is kept and the copies keep running",
            app.recorded.spec.state_file.display()
        ));
    }
    notes.extend(balancer_notes(name, traffic, d.refusing.get(name).map_or(&[], Vec::as_slice)));
    if let Some(why) = not_listening {
        notes.push(format!("{name}: port {}: not listening: {why}", app.recorded.spec.route.port));
    }
    notes.extend(crate::serve::watches::memory::notes(&d.cgroups, &app.recorded.spec));
    if let Some(uid) = app.recorded.state.uid.filter(|_| crate::serve::copies::act::runs_as_own_uid(&app.recorded.spec)) {
        notes.extend(crate::serve::views::identity_notes::writable_notes(name, &app.recorded.spec.start.sandbox.writable_paths, uid));
    }
    // The time of day of the last change, as the copies' start times show it.
    let time_of_day = |ms: u64| procfs::local_rfc3339(ms).get(11..19).unwrap_or_default().to_string();
    notes.extend(reconcile::capacity::note(name, app.recorded.spec.scale.replicas, capacity, time_of_day));
    notes.extend(app.recorded.state.held_by_memory.as_ref().map(|why| format!("{name} {why}.")));
    notes
}

/// The memory limit a copy runs under: its release's `sandbox.memory`,
/// unless the fence is off (then nothing enforces it).
fn memory_limit(recorded: &crate::serve::app::Recorded, rec: &crate::wire::CopyRecord) -> Option<u64> {
    let sandbox = crate::serve::watches::memory::sandbox_of(&recorded.spec, &recorded.state, rec);
    sandbox.memory.filter(|_| sandbox.mode != crate::manifest::SandboxMode::Off)
}

/// The size of a copy's disk: its release's `sandbox.disk`, unless the
/// fence is off (then nothing keeps it).
fn disk_size(recorded: &crate::serve::app::Recorded, rec: &crate::wire::CopyRecord) -> Option<u64> {
    let sandbox = crate::serve::watches::memory::sandbox_of(&recorded.spec, &recorded.state, rec);
    sandbox.disk.bytes().filter(|_| sandbox.mode != crate::manifest::SandboxMode::Off)
}

/// The lines under the table from what the load balancer sees: copies
/// that have not answered for a while, and requests it refuses because
/// copies died with them in flight.
fn balancer_notes(name: &str, traffic: Option<&HashMap<u32, CopyTraffic>>, refusing: &[Refusing]) -> Vec<String> {
    let mut out = Vec::new();
    let mut silent: Vec<&CopyTraffic> = traffic.map(|t| t.values().filter(|c| c.silent_ms > 0).collect()).unwrap_or_default();
    silent.sort_by_key(|c| c.copy);
    for c in silent {
        out.push(format!(
            "{name}: copy {} has not answered for {}s; it keeps its visitors but gets no new ones until it answers.",
            c.copy,
            c.silent_ms / 1000
        ));
    }
    for r in refusing {
        out.push(format!(
            "{name}: {} was in flight when two copies died within a minute; it is answered 502 at once for {}s more.",
            r.request,
            r.for_ms.div_ceil(1000)
        ));
    }
    out
}

/// The last line of R's in a copy's log that reads as an error (R writes
/// `Error…` / `Error in …`) or the launcher's line for a copy it could not
/// launch, from the log's last 16 KiB; long lines are cut, control
/// characters written out.
fn last_error_line(path: &std::path::Path) -> Option<String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path).ok()?;
    let len = f.metadata().ok()?.len();
    f.seek(SeekFrom::Start(len.saturating_sub(16 * 1024))).ok()?;
    let mut tail = Vec::new();
    f.read_to_end(&mut tail).ok()?;
    let text = String::from_utf8_lossy(&tail);
    let lines: Vec<&str> = text.lines().collect();
    // The launcher's own refusal (`mode: strict`, a mount that failed) too.
    let at = lines.iter().rposition(|l| l.starts_with("Error") || l.starts_with(crate::wire::launch::LAUNCH_FAILED_LINE))?;
    // R puts a long message on the lines after `Error in f(…) :`, indented
    // (`  cannot open the connection`): they are the error's point.
    let more = lines[at + 1..].iter().take_while(|l| l.starts_with(' ') && !l.trim().is_empty()).take(3).map(|l| l.trim());
    let line = std::iter::once(lines[at].trim()).chain(more).collect::<Vec<_>>().join(" ");
    // What the app wrote, shown in status and by `apply --wait`.
    let line = crate::sys::fmt::printable(&line);
    Some(if line.chars().count() > 200 { line.chars().take(200).chain("…".chars()).collect() } else { line.to_string() })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_last_error_line_of_a_log() {
        let temp = tempfile::tempdir().unwrap();
        let dir = temp.path();
        let log = dir.join("a.log");
        std::fs::write(&log, "--- shinyctl: copy 1 ---\nError in f(): first\nok\nError: boom\nExecution halted\n").unwrap();
        assert_eq!(super::last_error_line(&log).as_deref(), Some("Error: boom"));
        // R's message on the next lines, indented, is the error's point; a
        // parse error's code context after it is not.
        let parse = "Error in sourceUTF8(fullpath, envir = new.env(parent = sharedEnv)) : \n  /shinyctl/app/app.R:7:0: unexpected end of input\n5: \n6: shinyApp(ui, server\n  ^\nExecution halted\n";
        std::fs::write(&log, parse).unwrap();
        assert_eq!(
            super::last_error_line(&log).as_deref(),
            Some("Error in sourceUTF8(fullpath, envir = new.env(parent = sharedEnv)) : /shinyctl/app/app.R:7:0: unexpected end of input")
        );
        let refused = "--- shinyctl: the copy could not be launched: sandbox mode strict and fences are missing: pid-ns (x) ---";
        std::fs::write(&log, format!("{refused}\n")).unwrap();
        assert_eq!(super::last_error_line(&log).as_deref(), Some(refused));
        std::fs::write(&log, "Listening on http://127.0.0.1:20001\n").unwrap();
        assert_eq!(super::last_error_line(&log), None);
        assert_eq!(super::last_error_line(&dir.join("missing.log")), None);
    }

    #[test]
    fn the_load_balancers_view_makes_lines_under_the_table() {
        use super::{balancer_notes, CopyTraffic, HashMap, Refusing};
        let traffic: HashMap<u32, CopyTraffic> = [
            (2, CopyTraffic { copy: 2, connections: 1, sessions: 0, silent_ms: 0 }),
            (1, CopyTraffic { copy: 1, connections: 3, sessions: 2, silent_ms: 12_400 }),
        ]
        .into();
        let refusing = [Refusing { request: "GET /crash?x=1".into(), for_ms: 41_200 }];
        assert_eq!(
            balancer_notes("hello", Some(&traffic), &refusing),
            vec![
                "hello: copy 1 has not answered for 12s; it keeps its visitors but gets no new ones until it answers.",
                "hello: GET /crash?x=1 was in flight when two copies died within a minute; it is answered 502 at once for 42s more.",
            ]
        );
        assert!(balancer_notes("hello", None, &[]).is_empty());
    }
}

/// `runs_as_root` of an app whose copies a root daemon runs as root (no
/// `run-as`): in a user namespace of their own, so with no capability on
/// the host, unless the fence is off.
fn root_note(spec: &crate::manifest::AppSpec, daemon_is_root: bool) -> Option<String> {
    // Fenced, they run as the app's own uid (`uid` in status --json).
    if !daemon_is_root || spec.start.run_as.is_some() || spec.start.sandbox.mode != crate::manifest::SandboxMode::Off {
        return None;
    }
    Some("its copies run as root, with no fence (sandbox mode off); set run-as: USER to run them as a user of this machine, or leave the fence on to run them as the app's own uid".to_string())
}

#[cfg(test)]
mod root_note_tests {
    use super::root_note;

    #[test]
    fn a_root_daemon_without_run_as_and_with_the_fence_off_says_so() {
        let temp = tempfile::tempdir().unwrap();
        let path = temp.path();
        std::fs::write(path.join("app.R"), "").unwrap();
        let spec = crate::manifest::parse(&path.join("app.yaml"), "app-name: web\nport: 8080\nsandbox:\n  mode: off\n").unwrap();
        assert!(root_note(&spec, false).is_none(), "not root: no line");
        let line = root_note(&spec, true).unwrap();
        assert!(line.starts_with("its copies run as root, with no fence") && line.contains("run-as"), "{line}");
        let as_user = {
            let mut s = spec.clone();
            s.start.run_as = Some("shiny".into());
            s
        };
        assert!(root_note(&as_user, true).is_none(), "run-as set: no line");
        let fenced = {
            let mut s = spec;
            s.start.sandbox = Default::default();
            s
        };
        assert!(root_note(&fenced, true).is_none(), "fenced: the app's own uid");
    }
}

/// Where an app stands, as `status --json` names it.
fn app_state(recorded: &crate::serve::app::Recorded) -> &'static str {
    let state = &recorded.state;
    if recorded.deleting {
        "being-deleted"
    } else if state.stopped_since_ms.is_some() {
        "stopped"
    } else if state.asleep_since_ms.is_some() {
        "asleep"
    } else if state.rolled_back {
        "rolled-back"
    } else {
        "running"
    }
}
