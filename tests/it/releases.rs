//! Releases with real R, in the words of issue 7 and the README's "Releases": what
//! runs is what was deployed. An edit of app.R changes nothing until a
//! restart; old pages keep their version while it drains; a broken edit
//! never takes over; restart reads the manifest as it is now; rollback
//! brings the previous version back; a crash restart runs its release.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::helpers::*;

const START: Duration = Duration::from_secs(60);

/// An app whose page says its version (`version=v1;`), the copy, and the
/// GREETING it was started with; `live` is a reactive output over the
/// WebSocket, as in the shared test app.
fn app_r(version: &str) -> String {
    format!(
        r#"library(shiny)
ui <- function(req) {{
  fluidPage(
    tags$p(id = "version", "version={version};"),
    tags$p(id = "who", paste0("copy=", Sys.getenv("SHINYCTL_COPY"), ";")),
    tags$p(id = "greeting", paste0("greeting=", Sys.getenv("GREETING"), ";")),
    textOutput("live")
  )
}}
server <- function(input, output, session) {{
  output$live <- renderText(paste0("live-from-copy-", Sys.getenv("SHINYCTL_COPY")))
}}
shinyApp(ui, server)
"#
    )
}

/// Writes `apps/<name>/` with app.R at `version` and app.yaml (`app-name`,
/// `port`, then `extra`); returns (manifest, app.R).
fn versioned_app(env: &Env, name: &str, port: u16, extra: &str, version: &str) -> (PathBuf, PathBuf) {
    let manifest = env.app_running(&app_r(version), name, port, extra);
    let app_r_path = manifest.with_file_name("app.R");
    (manifest, app_r_path)
}

/// A versioned app at v1 with `warm-replicas: 0` and `extra` manifest
/// lines, applied and serving from copy 1; returns (port, manifest, app.R).
fn started_v1(env: &Env, name: &str, extra: &str) -> (u16, PathBuf, PathBuf) {
    let port = free_port();
    let (manifest, app_r_path) = versioned_app(env, name, port, &format!("warm-replicas: 0\n{extra}"), "v1");
    env.apply(&manifest);
    env.wait_roles(name, "1:active", START);
    wait_version(port, "v1");
    (port, manifest, app_r_path)
}

/// The version a visitor gets: a new one, or one holding this cookie.
fn version(port: u16, cookie: Option<&str>) -> Option<String> {
    let headers: Vec<(&str, &str)> = cookie.map(|c| vec![("Cookie", c)]).unwrap_or_default();
    let r = get(port, "/", &headers).ok().filter(|r| r.status == 200)?;
    between(&r.body, "version=", ";").map(str::to_string)
}

/// Waits until a fresh visitor gets `want`.
fn wait_version(port: u16, want: &str) {
    wait_until(START, &format!("new visitors to get {want}"), || (version(port, None).as_deref() == Some(want)).then_some(()));
}

/// Asserts that every request for `span` gets `want` with status 200 (the
/// test of a change that must not happen, watched for a while).
fn stays(port: u16, want: &str, span: Duration, why: &str) {
    let end = Instant::now() + span;
    while Instant::now() < end {
        assert_eq!(version(port, None).as_deref(), Some(want), "{why}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The release each copy runs, from status --json, by copy number.
fn releases(env: &Env, app: &str) -> Vec<(u32, Option<String>)> {
    let v = env.status();
    let a = v["apps"].as_array().unwrap().iter().find(|a| a["name"] == app).cloned().unwrap_or_default();
    a["copies"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| (c["copy"].as_u64().unwrap() as u32, c["release"].as_str().map(str::to_string)))
        .collect()
}

fn app_releases_dir(env: &Env, app: &str) -> PathBuf {
    env.home().join("releases/default").join(app)
}

#[test]
fn editing_app_r_in_place_changes_nothing_until_restart() {
    let env = Env::new("rel-edit");
    let port = free_port();
    let (manifest, app_r_path) = versioned_app(&env, "edit", port, "warm-replicas: 0\n", "v1");
    let out = env.apply(&manifest);
    assert!(out.contains("Release ") && out.contains(" taken in "), "apply says the release it took: {out}");
    env.wait_roles("edit", "1:active", START);
    wait_version(port, "v1");

    std::fs::write(&app_r_path, app_r("v2")).unwrap();
    // Shiny re-reads a changed app.R on a new page; the copy's is its release's.
    stays(port, "v1", Duration::from_secs(3), "an edit in working-dir changes nothing that runs");

    let out = env.ok(&["restart", "edit"]);
    assert!(out.contains("restarting at revision") && out.contains("Release "), "{out}");
    wait_version(port, "v2");
    let rel = releases(&env, "edit");
    assert!(rel.iter().all(|(_, r)| r.is_some()), "every copy runs a release: {rel:?}");

    // delete removes the app's releases and scratch disks.
    env.ok(&["delete", "edit", "--now"]);
    wait_until(Duration::from_secs(20), "the releases and scratch disks to go", || {
        (!app_releases_dir(&env, "edit").exists() && !env.home().join("scratch/default-edit").exists()).then_some(())
    });
}

#[test]
fn after_restart_an_old_page_keeps_the_old_version_and_new_visitors_get_the_new() {
    let env = Env::new("rel-cookie");
    let (port, _, app_r_path) = started_v1(&env, "ck", "drain-timeout: 60s\n");
    let first = get(port, "/", &[]).unwrap();
    let cookie = first.cookie().expect("a cookie for copy 1");
    let session = Session::open(port, &cookie);
    assert_eq!(session.copy, 1);

    std::fs::write(&app_r_path, app_r("v2")).unwrap();
    env.ok(&["restart", "ck"]);
    env.wait_roles("ck", "2:active 1:draining", START);
    assert_eq!(version(port, Some(&cookie)).as_deref(), Some("v1"), "the page held by the old copy's cookie gets the old version");
    assert_eq!(version(port, None).as_deref(), Some("v2"), "new visitors get the new one");

    let rel = releases(&env, "ck");
    let (old, new) = (rel.iter().find(|(c, _)| *c == 1).unwrap().1.clone(), rel.iter().find(|(c, _)| *c == 2).unwrap().1.clone());
    assert!(old.is_some() && new.is_some() && old != new, "status --json gives each copy's release: {rel:?}");
    let text = env.ok(&["status", "ck"]);
    let line = format!("ck: copy 1 runs the previous version (release {}); new copies run release {}.", old.unwrap(), new.unwrap());
    assert!(text.contains(&line), "the line under the table says which copies run the previous one:\n{text}");
    session.close();
}

#[test]
fn a_broken_edit_of_app_r_never_takes_over() {
    let env = Env::new("rel-broken");
    let (port, _, app_r_path) = started_v1(&env, "bk", "");

    let requests = Loop::start(port);
    std::fs::write(&app_r_path, format!("stop(\"boom\")\n{}", app_r("v2"))).unwrap();
    stays(port, "v1", Duration::from_secs(2), "a broken edit changes nothing before restart");
    env.ok(&["restart", "bk"]);
    let text = wait_until(Duration::from_secs(30), "status to say copy 2 doesn't start", || {
        let t = env.ok(&["status", "bk"]);
        t.contains("bk: copy 2 doesn't start: it exited with status 1").then_some(t)
    });
    assert!(text.contains("the old copies keep serving"), "{text}");
    stays(port, "v1", Duration::from_secs(2), "the old copy keeps answering 200 with the old version");
    assert_eq!(env.roles("bk"), "1:active");
    let log = std::fs::read_to_string(env.home().join("logs/default-bk@2.log")).unwrap();
    assert!(log.contains("boom"), "the new copy's log says why: {log}");
    let (sent, errors) = requests.finish();
    assert!(errors.is_empty(), "no request failed: {} of {sent}: {errors:?}", errors.len());
}

#[test]
fn restart_picks_up_an_env_edited_in_app_yaml() {
    let env = Env::new("rel-env");
    let (port, manifest, _) = started_v1(&env, "ev", "env:\n  GREETING: hello\n");
    assert!(get(port, "/", &[]).unwrap().body.contains("greeting=hello;"));

    std::fs::write(&manifest, format!("app-name: ev\nport: {port}\nwarm-replicas: 0\nenv:\n  GREETING: bonjour\n")).unwrap();
    env.ok(&["restart", "ev"]);
    wait_until(START, "the new copy to greet with the edited env", || {
        get(port, "/", &[]).ok().filter(|r| r.body.contains("greeting=bonjour;")).map(|_| ())
    });
}

#[test]
fn a_manifest_made_bad_before_restart_is_refused_and_nothing_changes() {
    let env = Env::new("rel-bad");
    let (port, manifest, _) = started_v1(&env, "bad", "");
    let pid = env.pid_of("bad", 1);
    let revision = || env.status()["apps"][0]["revision"].as_u64();
    let before = revision();
    let kept = listing(&app_releases_dir(&env, "bad"));
    let good = std::fs::read_to_string(&manifest).unwrap();

    let refused = |why: &str, expect: &[&str]| {
        let out = env.run(&["restart", "bad"]);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "{why}: refused");
        assert!(err.contains("bad: not restarted, nothing changed"), "{why}: {err}");
        for e in expect {
            assert!(err.contains(e), "{why}: {e:?} in {err}");
        }
    };
    std::fs::write(&manifest, format!("app-name: bad\nport: {port}\nreplicas: many\n")).unwrap();
    refused("a bad key", &["app.yaml:3: replicas"]);
    std::fs::write(&manifest, format!("app-name: other\nport: {port}\n")).unwrap();
    refused("another app-name", &["now names app-name other"]);
    std::fs::remove_file(&manifest).unwrap();
    refused("a manifest gone", &["cannot read its manifest", "app.yaml"]);

    assert_eq!(revision(), before, "no new revision");
    assert_eq!(listing(&app_releases_dir(&env, "bad")), kept, "no release taken");
    assert_eq!(env.roles("bad"), "1:active");
    assert_eq!(env.pid_of("bad", 1), pid, "the same copy runs");

    std::fs::write(&manifest, good).unwrap();
    env.ok(&["restart", "bad"]);
    env.wait_roles("bad", "2:active", START);
}

#[test]
fn rollback_brings_the_previous_version_back_with_no_failed_request() {
    let env = Env::new("rel-rollback");
    let (port, manifest, app_r_path) = started_v1(&env, "rb", "env:\n  GREETING: one\n");
    // By name, not by sorting: two releases of the same second sort by
    // their random part.
    let v1 = listing(&app_releases_dir(&env, "rb"));
    assert_eq!(v1.len(), 1, "{v1:?}");
    let out = env.run(&["rollback", "rb"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("no release before the current one"));

    std::fs::write(&app_r_path, app_r("v2")).unwrap();
    std::fs::write(&manifest, format!("app-name: rb\nport: {port}\nwarm-replicas: 0\nkeep-releases: 2\nenv:\n  GREETING: two\n")).unwrap();
    env.ok(&["restart", "rb", "--now"]);
    env.wait_roles("rb", "2:active", START);
    wait_version(port, "v2");

    let requests = Loop::start(port);
    let dirs_before = listing(&app_releases_dir(&env, "rb"));
    let out = env.ok(&["rollback", "rb"]);
    assert!(out.contains("rolling back to release"), "{out}");
    env.wait_roles("rb", "3:active", START);
    let page = get(port, "/", &[]).unwrap().body;
    assert!(
        page.contains("version=v1;") && page.contains("greeting=one;"),
        "the previous version with the settings it was deployed with: {page}"
    );
    let (sent, errors) = requests.finish();
    assert!(errors.is_empty(), "no failed request in the loop: {} of {sent}: {errors:?}", errors.len());
    assert_eq!(listing(&app_releases_dir(&env, "rb")), dirs_before, "nothing copied, nothing deleted");
    let text = env.ok(&["status", "rb"]);
    assert!(text.contains("rb: runs the rolled-back release") && text.contains("its manifest differs"), "{text}");

    // The next restart deploys the manifest again, and the line goes.
    env.ok(&["restart", "rb", "--now"]);
    env.wait_roles("rb", "4:active", START);
    wait_version(port, "v2");
    let text = env.ok(&["status", "rb"]);
    assert!(!text.contains("rolled-back"), "{text}");
    // keep-releases: 2: the current release and the newest other by deploy
    // order: v1, which the rollback deployed after v2 (v2, rolled away
    // from, goes; it is no rollback target either).
    wait_until(Duration::from_secs(30), "the unneeded release to be deleted", || {
        (listing(&app_releases_dir(&env, "rb")).len() == 2).then_some(())
    });
    let kept = listing(&app_releases_dir(&env, "rb"));
    let v2: Vec<&String> = dirs_before.iter().filter(|d| !v1.contains(d)).collect();
    assert!(kept.contains(&v1[0]) && !kept.contains(v2[0]), "v1 {v1:?} kept and v2 {v2:?} deleted: {kept:?}");
}

#[test]
fn a_copy_restarted_after_a_crash_runs_its_recorded_release() {
    let env = Env::new("rel-crash");
    let (port, _, app_r_path) = started_v1(&env, "cr", "");
    let recorded = releases(&env, "cr");

    std::fs::write(&app_r_path, app_r("v2")).unwrap();
    let pid = env.pid_of("cr", 1);
    signal(pid, 9);
    wait_until(START, "copy 1 to come back as another process", || {
        env.copies("cr").iter().find(|c| c.copy == 1 && c.ready && c.pid.is_some_and(|p| p != pid)).map(|_| ())
    });
    wait_http_ok(port, Duration::from_secs(10));
    assert_eq!(version(port, None).as_deref(), Some("v1"), "the recorded release, not the edited folder");
    assert_eq!(releases(&env, "cr"), recorded, "the same release");
}

/// A loop-mounted XFS filesystem (reflink on) in a temporary folder,
/// unmounted and removed when dropped.
struct Xfs {
    dir: PathBuf,
    mnt: PathBuf,
}

impl Xfs {
    fn new(name: &str) -> Xfs {
        let dir = std::env::temp_dir().join(format!("shinyctl-xfs-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mnt = dir.join("mnt");
        std::fs::create_dir_all(&mnt).unwrap();
        let img = dir.join("xfs.img");
        // Sparse: 320M is just over mkfs.xfs's smallest, and takes no room.
        std::fs::File::create(&img).unwrap().set_len(320 << 20).unwrap();
        let run = |cmd: &str, args: &[&std::ffi::OsStr]| {
            let out =
                std::process::Command::new(cmd).args(args).output().unwrap_or_else(|e| panic!("{cmd}: {e} (test.sh installs xfsprogs)"));
            assert!(out.status.success(), "{cmd} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        };
        run("mkfs.xfs", &["-q".as_ref(), "-m".as_ref(), "reflink=1".as_ref(), img.as_os_str()]);
        run("mount", &["-o".as_ref(), "loop".as_ref(), img.as_os_str(), mnt.as_os_str()]);
        Xfs { dir, mnt }
    }

    /// Bytes in use on the filesystem.
    fn used(&self) -> u64 {
        let out = std::process::Command::new("df").args(["-B1", "--output=used"]).arg(&self.mnt).output().unwrap();
        String::from_utf8_lossy(&out.stdout).lines().nth(1).and_then(|l| l.trim().parse().ok()).expect("df's used bytes")
    }
}

impl Drop for Xfs {
    fn drop(&mut self) {
        // The copies' disks of their own are mounted below the home on this
        // filesystem, and outlive the daemon: `Env`'s drop looks for them
        // below its own folder, where the home is only a symlink. Every mount
        // here goes, this filesystem's with them; a loop mount frees its loop
        // device when unmounted (autoclear).
        shinyctl::sys::disk::detach_below(&self.mnt).into_iter().for_each(|t| drop(t.join()));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn a_release_on_xfs_shares_its_extents_with_working_dir() {
    if !needs_root("a loop-mounted XFS") {
        return;
    }
    let xfs = Xfs::new("extents");
    let env = Env::new("rel-xfs");
    // SHINYCTL_HOME and the app on the same XFS, so a release can share extents.
    std::fs::create_dir_all(xfs.mnt.join("home")).unwrap();
    std::fs::remove_dir(env.home()).unwrap();
    std::os::unix::fs::symlink(xfs.mnt.join("home"), env.home()).unwrap();
    let app = xfs.mnt.join("app");
    std::fs::create_dir_all(&app).unwrap();
    let data: Vec<u8> = (0..16u32 << 20).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    std::fs::write(app.join("data.bin"), &data).unwrap();
    std::fs::write(app.join("app.R"), app_r("v1")).unwrap();
    let port = free_port();
    let manifest = app.join("app.yaml");
    std::fs::write(&manifest, format!("app-name: xfs\nport: {port}\nwarm-replicas: 0\n")).unwrap();
    let used_before = xfs.used();

    let out = env.apply(&manifest);
    let id = between(&out, "Release ", ":").expect("apply names its release").to_string();
    let copy = xfs.mnt.join("home/releases/default/xfs").join(&id).join("data.bin");
    assert_eq!(std::fs::read(&copy).unwrap(), data, "the release holds the same bytes");
    let frag = std::process::Command::new("filefrag").arg("-v").arg(&copy).output().expect("filefrag (e2fsprogs)");
    let frag = String::from_utf8_lossy(&frag.stdout);
    let extents: Vec<&str> = frag.lines().filter(|l| l.contains(':') && l.trim_start().starts_with(char::is_numeric)).collect();
    assert!(!extents.is_empty() && extents.iter().all(|l| l.contains("shared")), "every extent is shared:\n{frag}");
    let grew = xfs.used().saturating_sub(used_before);
    assert!(grew < 2 << 20, "16 MiB taken as a release used {grew} bytes of disk, not another 16 MiB");
}

#[test]
fn a_wake_and_a_scale_up_run_the_recorded_release_not_the_edited_folder() {
    let env = Env::new("rel-wake");
    let port = free_port();
    let (manifest, app_r_path) = versioned_app(&env, "wk", port, "warm-replicas: 0\nidle-timeout: 2s\n", "v1");
    env.apply(&manifest);
    wait_version(port, "v1");
    std::fs::write(&app_r_path, app_r("v2")).unwrap();
    env.wait_asleep("wk", Duration::from_secs(30));
    assert_eq!(version(port, None).as_deref(), Some("v1"), "the wake runs the recorded release");

    // replicas changes how many copies run, not how they start: no deploy.
    // round-robin: so a page surely comes from the new copy (least-conn's
    // tie goes to copy 1).
    std::fs::write(
        &manifest,
        format!("app-name: wk\nport: {port}\nwarm-replicas: 0\nreplicas: 2\nidle-timeout: 1h\nlb-policy: round-robin\n"),
    )
    .unwrap();
    let out = env.apply(&manifest);
    assert!(!out.contains("Release "), "no release taken: {out}");
    wait_http_ok(port, START); // wakes it, if it fell asleep again meanwhile
    env.wait_roles("wk", "1:active 2:active", START);
    let rel = releases(&env, "wk");
    assert!(rel.len() == 2 && rel[0].1.is_some() && rel[0].1 == rel[1].1, "the new copy runs the recorded release: {rel:?}");
    let second = wait_until(Duration::from_secs(10), "a page from copy 2", || get(port, "/", &[]).ok().filter(|r| r.copy() == Some(2)));
    assert!(second.body.contains("version=v1;"), "the new copy serves the recorded release: {}", second.body);
}
