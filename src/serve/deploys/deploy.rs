//! Deploys: `apply`, `restart` and `rollback`. A deploy that starts new
//! copies (the first apply, an apply that changes how the app starts, every
//! restart) takes a release first. The copy is made off the daemon's lock,
//! so `status` keeps answering; then the lock is taken again, everything is
//! checked once more, and the release is renamed into place and recorded.
//! Whatever is refused changes nothing that runs.

use std::path::PathBuf;

use crate::home::Home;
use crate::manifest::{self, AppSpec};
use crate::release::{self, snapshot};
use crate::wire::{AppState, ApplyRequest, Release};

use crate::serve::deploys::sockets;
use crate::serve::error::{Done, ServeError};
use crate::serve::now_ms;
use crate::serve::state_files;
use crate::serve::AppRt;
use crate::serve::Daemon;
use crate::serve::Event;
use crate::serve::Shared;

/// A release copied into its hidden folder, not yet recorded.
struct TakenRelease {
    /// The copy, renamed into place when recorded; removed if dropped.
    pending: snapshot::Pending,
    /// Its id.
    id: String,
    /// The settings it is deployed with.
    deployed: crate::manifest::StartSpec,
    /// Unix ms when it was taken.
    taken_ms: u64,
}

impl TakenRelease {
    /// Renames the copy into place and makes it the app's current release.
    /// Release folders no state names (an earlier life of the app) go.
    fn record(self, home: &Home, spec: &AppSpec, state: &mut AppState) -> Result<Release, String> {
        let (bytes, files, took_ms) = (self.pending.bytes, self.pending.files, self.pending.took.as_millis() as u64);
        let dir =
            self.pending.commit().map_err(|e| format!("{}: cannot put the release in place: {e}; nothing was deployed", spec.name))?;
        let rel = Release {
            id: self.id,
            dir,
            taken_ms: self.taken_ms,
            bytes,
            files,
            took_ms,
            deployed: self.deployed,
            copies: Vec::new(),
            served: Some(false),
            ..Release::default()
        };
        release::record(state, rel.clone());
        for orphan in release::orphans(&home.app_releases(&spec.group, &spec.name), state) {
            crate::home::remove_later(&orphan);
        }
        Ok(rel)
    }
}

/// The line apply and restart add about the release they took.
fn taken_line(rel: &Release) -> String {
    format!(
        "Release {}: {} in {} files, taken in {}.",
        rel.id,
        crate::sys::fmt::size(rel.bytes, crate::sys::fmt::SizeStyle::Prose),
        rel.files,
        crate::sys::fmt::duration(std::time::Duration::from_millis(rel.took_ms), crate::sys::fmt::DurationStyle::Took)
    )
}

/// Takes a release of the spec's working-dir, off the daemon's lock.
async fn take(shared: &Shared, spec: &AppSpec) -> Result<TakenRelease, ServeError> {
    // Every app's state file, the others' too: one in this working-dir
    // holds that app's env, secrets included, which this app must not get.
    let (home, state_files) = {
        let d = shared.lock();
        (d.home.clone(), d.apps.values().map(|a| a.recorded.spec.state_file.clone()).collect::<Vec<_>>())
    };
    let taken_ms = now_ms();
    let id = release::new_id(taken_ms);
    let dest = home.release_dir(&spec.group, &spec.name, &id);
    let source = release::source(spec, &home, &state_files);
    let copied = tokio::task::spawn_blocking(move || snapshot::take(&source, &dest, release::LIMIT_BYTES)).await;
    let refused = |why: String| {
        ServeError::Invalid(format!("{}: cannot take a release, so nothing was deployed and nothing that runs changed: {why}", spec.name))
    };
    match copied {
        Ok(Ok(pending)) => Ok(TakenRelease { pending, id, deployed: spec.start.clone(), taken_ms }),
        Ok(Err(why)) => Err(refused(why.to_string())),
        Err(e) => Err(refused(format!("the copy stopped: {e}"))),
    }
}

/// Checks a spec against the other apps (name, port, state-file) and an
/// app of the same name being deleted. Returns the name of the app this
/// manifest already is (the same manifest file), if any.
fn check(d: &Daemon, spec: &AppSpec, lines: &manifest::KeyLines) -> Result<Option<String>, ServeError> {
    let here = |key: &str, message: String| {
        manifest::ManifestError { file: spec.manifest.clone(), line: lines.line(key), key: Some(key.into()), message }.to_string()
    };
    if let Some(why) = run_as_unreachable(d, spec) {
        return Err(ServeError::Invalid(here("run-as", why)));
    }
    if let Some(why) = writable_in_home(&d.home.root, &spec.start.sandbox.writable_paths) {
        return Err(ServeError::Invalid(here("sandbox", why)));
    }
    let existing = d
        .apps
        .iter()
        .find(|(_, a)| !a.recorded.deleting && crate::serve::same_path(&a.recorded.spec.manifest, &spec.manifest))
        .map(|(n, _)| n.clone());
    if existing.is_none() && d.apps.get(&spec.name).is_some_and(|a| a.recorded.deleting) {
        let name = &spec.name;
        let why = format!("{name} is being deleted; its copies stop once their sessions end. Apply again once `shinyctl status` no longer lists it, or use `shinyctl delete {name} --now` first");
        return Err(ServeError::Clash(here("app-name", why)));
    }
    for (name, other) in d.apps.iter().filter(|(n, a)| Some(*n) != existing.as_ref() && !a.recorded.deleting) {
        if *name == spec.name {
            return Err(ServeError::Clash(here(
                "app-name",
                format!("{name} is already the name of the app in {}; pick another name", other.recorded.spec.manifest.display()),
            )));
        }
        if other.recorded.spec.route.port == spec.route.port {
            return Err(ServeError::Clash(here(
                "port",
                format!(
                    "{} is already used by app {name} ({}); pick another port",
                    spec.route.port,
                    other.recorded.spec.manifest.display()
                ),
            )));
        }
        let (log, other_log) = (format!("{}-{}", spec.group, spec.name), format!("{}-{}", other.recorded.spec.group, name));
        if log == other_log {
            let (group, other_group) = (&spec.group, &other.recorded.spec.group);
            let why = format!("app-group {group} with app-name {} would share the log file logs/{log}.log with app {name} of app-group {other_group}; rename one of them", spec.name);
            return Err(ServeError::Clash(here("app-group", why)));
        }
        if crate::serve::same_path(&other.recorded.spec.state_file, &spec.state_file) {
            return Err(ServeError::Clash(here(
                "state-file",
                format!("{} is already the state file of app {name}; set state-file to another path", spec.state_file.display()),
            )));
        }
    }
    Ok(existing)
}

/// Why a root daemon cannot run this spec's copies as its `run-as` user
/// with the fence off: with no mount namespace the copy reaches its release
/// and disk by their paths in the daemon's home, which is 0700 (it holds the
/// cookie key, every app's state and releases) and root's, so the user's R
/// could not enter its app folder and every start would fail.
fn run_as_unreachable(d: &Daemon, spec: &AppSpec) -> Option<String> {
    let user = spec.start.run_as.as_deref()?;
    if spec.start.sandbox.mode != crate::manifest::SandboxMode::Off || !nix::unistd::geteuid().is_root() {
        return None;
    }
    Some(format!(
        "{user} with sandbox.mode: off cannot work under a root daemon: such a copy runs as {user} without a mount namespace, and {user} cannot reach its release and disk in shinyctl's home ({}, mode 0700, root's); use sandbox.mode: on (the default), where the copy sees them through its own namespace, and still runs as {user}",
        d.home.root.display()
    ))
}

/// Why a `writable-paths` entry cannot be: it is in shinyctl's home (or is
/// it, or holds it), which every copy has hidden (it holds the cookie key,
/// every app's state, releases and control sockets); a writable mount
/// there would undo the cover.
fn writable_in_home(home: &std::path::Path, writable: &[std::path::PathBuf]) -> Option<String> {
    let real = |p: &std::path::Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let home = real(home);
    writable.iter().find_map(|w| {
        let real_w = real(w);
        let how = if real_w == home {
            "is"
        } else if real_w.starts_with(&home) {
            "is in"
        } else if home.starts_with(&real_w) {
            "holds"
        } else {
            return None;
        };
        Some(format!(
            "writable-paths: {} {how} shinyctl's home ({}), which every copy has hidden (it holds the cookie key, every app's state and the control sockets); give a path outside it",
            w.display(),
            home.display()
        ))
    })
}

/// The app's listening socket, bound now when the daemon does not hold it
/// yet: the bind is the check that the port can be had (not taken by
/// another program or shinyctl home, permitted, an address of this
/// machine). `None` when it is held already, or when this app's own socket
/// on another host holds the port (a host change: rebound once the old one
/// is closed).
async fn claim(
    shared: &Shared,
    spec: &AppSpec,
    lines: &manifest::KeyLines,
) -> Result<Option<(sockets::Addr, std::net::TcpListener)>, ServeError> {
    let addr = (spec.route.host.to_string(), spec.route.port);
    let own_port = {
        let d = shared.lock();
        if d.sockets.holds(&addr) {
            return Ok(None);
        }
        // This app's own socket on another host, held now.
        d.apps
            .values()
            .filter(|a| crate::serve::same_path(&a.recorded.spec.manifest, &spec.manifest) && a.recorded.spec.route.port == spec.route.port)
            .any(|a| d.sockets.holds(&(a.recorded.spec.route.host.to_string(), a.recorded.spec.route.port)))
    };
    let (host, port) = addr.clone();
    let bound =
        tokio::task::spawn_blocking(move || sockets::bind(&host, port).map_err(|e| (e.raw_os_error(), sockets::explain(&host, port, &e))))
            .await
            .map_err(|e| ServeError::Failed(format!("cannot bind the app's port: {e}")))?;
    match bound {
        Ok(socket) => Ok(Some((addr, socket))),
        Err((Some(libc::EADDRINUSE), _)) if own_port => Ok(None),
        Err((code, why)) => {
            let key = if matches!(code, Some(libc::EADDRINUSE) | Some(libc::EACCES) | Some(libc::EPERM)) { "port" } else { "host" };
            let message = manifest::ManifestError {
                file: spec.manifest.clone(),
                line: lines.line(key),
                key: Some(key.into()),
                message: format!("{why}. Nothing was applied"),
            };
            Err(ServeError::Clash(message.to_string()))
        }
    }
}

/// True when applying `spec` to the app deploys it: it changes how the app
/// starts, or the app runs a rolled-back release (the manifest is what runs
/// again after an apply; not after a reload, `keep_rollback`).
fn deploys(app: Option<&AppRt>, spec: &AppSpec, keep_rollback: bool) -> bool {
    app.is_none_or(|a| a.recorded.spec.settings_hash() != spec.settings_hash() || (a.recorded.state.rolled_back && !keep_rollback))
}

/// `POST /v1/apply`: parse and validate the manifest whole, check it
/// against the other apps, take a release when it deploys, then record it.
pub async fn apply(shared: &Shared, req: ApplyRequest) -> Result<Done, ServeError> {
    let path = PathBuf::from(&req.path);
    let (spec, lines) = manifest::parse_with_lines(&path, &req.text).map_err(|e| ServeError::Invalid(e.to_string()))?;
    if let Err(why) = state_files::check_state_file(&spec.state_file) {
        let at = manifest::ManifestError {
            file: spec.manifest.clone(),
            line: lines.line("state-file"),
            key: Some("state-file".into()),
            message: why.to_string(),
        };
        return Err(ServeError::Invalid(at.to_string()));
    }
    let (home, needs) = {
        let d = shared.lock();
        let existing = check(&d, &spec, &lines)?;
        (d.home.clone(), deploys(existing.and_then(|n| d.apps.get(&n)), &spec, req.keep_rollback))
    };
    let socket = claim(shared, &spec, &lines).await?;
    let taken = if needs { Some(take(shared, &spec).await?) } else { None };
    let mut d = shared.lock();
    // The world may have changed while the release was copied.
    let existing = check(&d, &spec, &lines)?;
    if taken.is_none() && deploys(existing.as_ref().and_then(|n| d.apps.get(n)), &spec, req.keep_rollback) {
        return Err(ServeError::Clash(format!("{}: changed while this apply ran; apply again", spec.name)));
    }
    if let Some((addr, socket)) = socket {
        d.sockets.insert(addr, socket);
    }
    let deployed_now = taken.is_some();
    let message = match existing {
        Some(old_name) => update(&mut d, &home, old_name, &spec, taken, &req)?,
        None => add(&mut d, &home, &spec, taken)?,
    };
    d.save_registry().map_err(ServeError::Registry)?;
    let _ = d.events.send(Event::Changed { app: spec.name.clone() });
    let revision = d.apps.get(&spec.name).map(|a| a.recorded.state.revision).filter(|_| deployed_now && !is_stopped(&d, &spec.name));
    Ok(Done::deployed(message, revision))
}

/// apply on an app the daemon has: the new spec in place (under its new
/// name, if it changed), a new revision when a release was taken.
fn update(
    d: &mut Daemon,
    home: &Home,
    old_name: String,
    spec: &AppSpec,
    taken: Option<TakenRelease>,
    req: &ApplyRequest,
) -> Result<String, ServeError> {
    let now = req.now;
    let mut app = d.apps.remove(&old_name).expect("checked above");
    let was_rolled_back = app.recorded.state.rolled_back && !req.keep_rollback;
    let restarts = app.recorded.spec.settings_hash() != spec.settings_hash() || was_rolled_back;
    let same = app.recorded.spec == *spec && !restarts;
    let rel = match taken.map(|t| t.record(home, spec, &mut app.recorded.state)).transpose() {
        Ok(rel) => rel,
        Err(why) => {
            d.apps.insert(old_name, app);
            return Err(ServeError::Failed(why));
        }
    };
    if rel.is_some() {
        app.recorded.state.revision += 1;
    }
    if !crate::serve::same_path(&app.recorded.spec.state_file, &spec.state_file) {
        state_files::remove_state(&app.recorded.spec.state_file);
    }
    let (old_group, old_name) = (app.recorded.spec.group.clone(), app.recorded.spec.name.clone());
    let renamed = (old_group.as_str(), old_name.as_str()) != (spec.group.as_str(), spec.name.as_str());
    if renamed {
        super::rename::move_app(home, (&old_group, &old_name), (&spec.group, &spec.name), &mut app.recorded.state);
    }
    app.recorded.spec = spec.clone();
    app.recorded.state.stop_now = now;
    let asleep = app.recorded.state.asleep_since_ms.is_some();
    let stopped = app.recorded.state.stopped_since_ms.is_some();
    state_files::record(&app.recorded, &mut app.tracked);
    d.apps.insert(spec.name.clone(), app);
    let name = &spec.name;
    let old_go = if now { "the old ones stop as soon as the new ones are ready" } else { "the old ones drain" };
    let line = if same {
        format!("{name}: unchanged.")
    } else if stopped && (restarts || renamed) {
        format!("{name}: changed how it starts, {STOPPED}.")
    } else if was_rolled_back && !asleep {
        format!("{name}: deploys the manifest again in place of the rolled-back release; new copies start and {old_go}. Watch: shinyctl status {name}")
    } else if renamed && asleep {
        format!("{name}: renamed from {old_group}/{old_name}; {}. Watch: shinyctl status {name}", ASLEEP_CHECK.trim_start_matches("but "))
    } else if renamed {
        format!("{name}: renamed from {old_group}/{old_name}; new copies start and {old_go}, their disks and logs now under the new name. Watch: shinyctl status {name}")
    } else if restarts && asleep {
        format!("{name}: changed how it starts; {}. Watch: shinyctl status {name}", ASLEEP_CHECK.trim_start_matches("but "))
    } else if restarts {
        format!("{name}: changed how it starts; new copies start and {old_go}. Watch: shinyctl status {name}")
    } else {
        format!("{name}: updated without restarting any copy.")
    };
    Ok(with_release(line, rel.as_ref()))
}

/// apply of a new app: its first state and, when it deploys, its release.
fn add(d: &mut Daemon, home: &Home, spec: &AppSpec, taken: Option<TakenRelease>) -> Result<String, ServeError> {
    // A new app: state.json from an earlier life names no process we
    // hold, so it starts afresh, at a revision after the old one.
    let old = state_files::load_state(&spec.state_file).unwrap_or_default();
    let mut state = AppState { app: spec.name.clone(), revision: old.revision + 1, next_copy: 1, ..Default::default() };
    let rel = match taken.map(|t| t.record(home, spec, &mut state)).transpose() {
        Ok(rel) => rel,
        Err(why) => return Err(ServeError::Failed(why)),
    };
    if let Err(e) = state_files::save_state(&spec.state_file, &state, true) {
        return Err(ServeError::Invalid(format!(
            "{}: cannot write its state file {}: {e}; nothing was started",
            spec.name,
            spec.state_file.display()
        )));
    }
    // A new app never finds another's files (left by a daemon that ended
    // before it removed them).
    crate::wire::launch::remove_app_scratch(&home.app_scratch(&spec.group, &spec.name));
    d.apps.insert(spec.name.clone(), AppRt::new(spec.clone(), state));
    let n = spec.scale.replicas + spec.scale.warm_replicas;
    let line = format!(
        "{}: applied; starting {n} {} on port {}. Watch: shinyctl status {}",
        spec.name,
        if n == 1 { "copy" } else { "copies" },
        spec.route.port,
        spec.name
    );
    Ok(with_release(line, rel.as_ref()))
}

fn with_release(line: String, rel: Option<&Release>) -> String {
    match rel {
        Some(rel) => format!("{line}\n{}", taken_line(rel)),
        None => line,
    }
}

/// `POST /v1/apps/NAME/restart`: reads the app's manifest from the path it
/// was applied from, as it is now, validates it like apply, takes a release
/// and redeploys. A manifest that is gone, bad, or names another app is
/// refused, and nothing changes.
pub async fn restart(shared: &Shared, name: &str, now: bool) -> Result<Done, ServeError> {
    let (home, manifest_path) = {
        let d = shared.lock();
        let Some(app) = d.apps.get(name).filter(|a| !a.recorded.deleting) else { return Err(ServeError::NoSuchApp(name.to_string())) };
        (d.home.clone(), app.recorded.spec.manifest.clone())
    };
    let refused = |why: String| Err(ServeError::Invalid(format!("{name}: not restarted, nothing changed: {why}")));
    let text = match tokio::fs::read_to_string(&manifest_path).await {
        Ok(t) => t,
        Err(e) => {
            return refused(format!(
            "cannot read its manifest {} ({e}); restart reads the manifest it was applied from. If it moved, apply it from where it is now",
            manifest_path.display()
        ))
        }
    };
    let (spec, lines) = match manifest::parse_with_lines(&manifest_path, &text) {
        Ok(s) => s,
        Err(e) => return refused(format!("its manifest is not valid now:\n{e}")),
    };
    if spec.name != name {
        return refused(format!(
            "its manifest {} now names app-name {}; restart only restarts {name}. To rename the app, apply the manifest",
            manifest_path.display(),
            spec.name
        ));
    }
    check(&shared.lock(), &spec, &lines)?;
    let socket = claim(shared, &spec, &lines).await?;
    let taken = take(shared, &spec).await?;
    let mut d = shared.lock();
    match check(&d, &spec, &lines) {
        Ok(Some(existing)) if existing == name => {}
        Ok(_) => return Err(ServeError::NoSuchApp(name.to_string())),
        Err(e) => return Err(e),
    }
    if let Some((addr, socket)) = socket {
        d.sockets.insert(addr, socket);
    }
    let app = d.apps.get_mut(name).expect("checked above");
    let rel = match taken.record(&home, &spec, &mut app.recorded.state) {
        Ok(rel) => rel,
        Err(why) => return Err(ServeError::Failed(why)),
    };
    if !crate::serve::same_path(&app.recorded.spec.state_file, &spec.state_file) {
        state_files::remove_state(&app.recorded.spec.state_file);
    }
    app.recorded.spec = spec;
    let (rev, how) = redeploy(&mut d, name, now)?;
    let stopped = is_stopped(&d, name);
    let line = if stopped {
        format!("{name}: revision {rev} recorded, {how}.")
    } else {
        format!("{name}: restarting at revision {rev}; new copies start, {how}. Watch: shinyctl status {name}")
    };
    Ok(Done::deployed(with_release(line, Some(&rel)), Some(rev).filter(|_| !stopped)))
}

/// The end of restart and rollback, with the app's spec and release in
/// place: a new revision (so every copy is outdated), saved, and the cycle
/// told. Returns the revision and how the old copies go.
fn redeploy(d: &mut Daemon, name: &str, now: bool) -> Result<(u64, &'static str), ServeError> {
    let app = d.apps.get_mut(name).expect("the caller holds the app");
    app.recorded.state.revision += 1;
    app.recorded.state.stop_now = now;
    let rev = app.recorded.state.revision;
    let asleep = app.recorded.state.asleep_since_ms.is_some();
    let stopped = app.recorded.state.stopped_since_ms.is_some();
    state_files::record(&app.recorded, &mut app.tracked);
    d.save_registry().map_err(ServeError::Registry)?;
    let _ = d.events.send(Event::Changed { app: name.to_string() });
    Ok((
        rev,
        if stopped {
            STOPPED
        } else if asleep {
            ASLEEP_CHECK
        } else if now {
            "the old ones stop as soon as the new ones are ready"
        } else {
            "the old ones drain"
        },
    ))
}

/// What a redeploy of a stopped app does, as the command says it.
const STOPPED: &str = "but the app is stopped (shinyctl stop): no copy starts, and `shinyctl start` runs this version";

/// True when the app is stopped (`shinyctl stop`): a deploy is recorded and
/// starts nothing, so `--wait` has nothing to wait for.
fn is_stopped(d: &Daemon, name: &str) -> bool {
    d.apps.get(name).is_some_and(|a| a.recorded.state.stopped_since_ms.is_some())
}

/// What a redeploy of a sleeping app does, as the command says it.
const ASLEEP_CHECK: &str = "but the app is asleep: one copy of the new version starts to check it and then sleeps; until it has been ready, the app keeps the version before (and wakes with it)";

/// `POST /v1/apps/NAME/rollback`: redeploys the release before the current
/// one with the settings it was deployed with, through the same draining
/// path, copying nothing. A second rollback goes back to where the first
/// one came from.
pub async fn rollback(shared: &Shared, name: &str, now: bool, to: Option<&str>) -> Result<Done, ServeError> {
    let mut d = shared.lock();
    let Some(app) = d.apps.get_mut(name).filter(|a| !a.recorded.deleting) else { return Err(ServeError::NoSuchApp(name.to_string())) };
    let rel = release::roll_back(&mut app.recorded.state, name, to)?;
    app.recorded.spec = app.recorded.spec.with_start(&rel.deployed);
    let (rev, how) = redeploy(&mut d, name, now)?;
    let taken = crate::sys::procfs::local_rfc3339(rel.taken_ms);
    let stopped = is_stopped(&d, name);
    let line = if stopped {
        format!(
            "{name}: rolled back to release {} (taken {taken}) with the settings it was deployed with, at revision {rev}, {how}.",
            rel.id
        )
    } else {
        format!(
            "{name}: rolling back to release {} (taken {taken}) with the settings it was deployed with, at revision {rev}; new copies start, {how}. Watch: shinyctl status {name}",
            rel.id
        )
    };
    Ok(Done::deployed(line, Some(rev).filter(|_| !stopped)))
}
