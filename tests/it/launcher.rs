//! The copy launcher with real R: a copy runs in its own mount namespace
//! where its folder is read-only in fact (the tests run as root in CI, whom
//! mode bits don't stop), at a fixed path, with its scratch disk at another;
//! where no namespace can be made, Landlock keeps the folder unwritten; and
//! `status --json` says which a copy got.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::helpers::*;

/// An app that tries to write into its own folder (and survives the
/// refusal, logging R's message), writes a file to its scratch disk, and
/// shows what it saw.
const PROBE_R: &str = r#"
library(shiny)
wrote <- tryCatch({ writeLines("x", "written-by-app.txt"); "yes" },
  warning = function(w) { message("Warning: ", conditionMessage(w)); "no" },
  error = function(e) { message("Error: ", conditionMessage(e)); "no" })
writeLines("from the app", file.path(Sys.getenv("SHINYCTL_SCRATCH"), "from-app.txt"))
ui <- fluidPage(
  tags$p(paste0("wd=", getwd(), ";")),
  tags$p(paste0("scratch=", Sys.getenv("SHINYCTL_SCRATCH"), ";")),
  tags$p(paste0("wrote=", wrote, ";"))
)
shinyApp(ui, function(input, output) {})
"#;

/// An app that writes into its own folder the way an app written for a
/// writable folder does: unguarded, so it fails at start.
const WRITER_R: &str = r#"
writeLines("x", "written-by-app.txt")
shiny::shinyApp(shiny::fluidPage("never served"), function(input, output) {})
"#;

/// Writes an app folder with this app.R; returns (manifest, folder).
fn app_with(env: &Env, name: &str, port: u16, app_r: &str) -> (PathBuf, PathBuf) {
    let manifest = env.app_running(app_r, name, port, "warm-replicas: 0\n");
    let folder = manifest.parent().unwrap().to_path_buf();
    (manifest, folder)
}

/// The `isolation` of copy 1 of the app in `status --json`.
fn isolation(env: &Env, app: &str) -> Value {
    let v = env.status();
    let a = v["apps"].as_array().unwrap().iter().find(|a| a["name"] == app).cloned().expect("the app in status");
    a["copies"][0]["isolation"].clone()
}

/// Waits until the copy's log holds `needle`; returns the log.
fn wait_log(env: &Env, log: &str, needle: &str) -> String {
    let path = env.home().join("logs").join(log);
    wait_until(Duration::from_secs(60), &format!("{needle:?} in {log}"), || {
        std::fs::read_to_string(&path).ok().filter(|t| t.contains(needle))
    })
}

/// Applies the probe app, waits for its copy and returns its page.
fn deploy(env: &Env, name: &str, manifest: &Path, port: u16) -> String {
    env.apply(manifest);
    env.wait_roles(name, "1:active", Duration::from_secs(60));
    wait_http_ok(port, Duration::from_secs(10)).body
}

/// The release folder copy 1 of the app runs from (what a write the fence
/// let through would change; working-dir is only its source).
fn run_folder(env: &Env, app: &str) -> PathBuf {
    let v = env.status();
    let a = v["apps"].as_array().unwrap().iter().find(|a| a["name"] == app).cloned().expect("the app in status");
    let release = a["copies"][0]["release"].as_str().expect("the copy's release").to_string();
    env.home().join("releases/default").join(app).join(release)
}

/// Checks what the probe app did: its write into its folder failed and the
/// folder it runs from (its release) holds what working-dir held, and its
/// scratch file is on the host's scratch disk.
fn assert_folder_kept_scratch_written(env: &Env, name: &str, page: &str, folder: &Path, before: &[String]) {
    assert_eq!(listing(&run_folder(env, name)), before, "the folder the copy runs from is unchanged");
    assert_eq!(listing(folder), before, "the app folder is unchanged");
    assert_eq!(between(page, "wrote=", ";"), Some("no"), "the write into its folder failed: {page}");
    let scratch = env.home().join(format!("scratch/default-{name}/1/from-app.txt"));
    assert_eq!(std::fs::read_to_string(&scratch).unwrap(), "from the app\n", "written to SHINYCTL_SCRATCH, seen on the host");
}

#[test]
fn a_copy_runs_in_its_own_mount_namespace_with_its_folder_read_only() {
    let env = Env::new("mountns");
    let port = free_port();
    let (manifest, folder) = app_with(&env, "probe", port, PROBE_R);
    let before = listing(&folder);
    let page = deploy(&env, "probe", &manifest, port);

    assert_eq!(between(&page, "wd=", ";"), Some("/shinyctl/app"), "the working directory is the fixed path: {page}");
    assert_eq!(between(&page, "scratch=", ";"), Some("/shinyctl/scratch"), "SHINYCTL_SCRATCH is the fixed path: {page}");
    assert_folder_kept_scratch_written(&env, "probe", &page, &folder, &before);

    let log = wait_log(&env, "default-probe.log", "Read-only file system");
    assert!(
        log.contains(
            "isolation: mount namespace. The app's folder /shinyctl/app is read-only: write to SHINYCTL_SCRATCH (/shinyctl/scratch)"
        ),
        "{log}"
    );
    let iso = isolation(&env, "probe");
    assert_eq!(iso["kind"], "mount-namespace", "{iso}");
    assert!(iso["reason"].is_null(), "{iso}");

    // An app that writes unguarded fails at once, with R's error in its log,
    // and its folder stays as it was.
    let (manifest, folder) = app_with(&env, "writer", free_port(), WRITER_R);
    let before = listing(&folder);
    env.apply(&manifest);
    let log = wait_log(&env, "default-writer.log", "Read-only file system");
    assert!(log.contains("cannot open file 'written-by-app.txt': Read-only file system"), "{log}");
    assert!(log.contains("is read-only: write to SHINYCTL_SCRATCH"), "the launcher said where to write first: {log}");
    assert_eq!(listing(&run_folder(&env, "writer")), before, "the folder the copy runs from is unchanged");
    assert_eq!(listing(&folder), before, "the app folder is unchanged");
}

/// Starts `shinyctl serve` for this test's home through a wrapper
/// (`program args… BIN serve`, the wrapper exec'ing it); returns its PID
/// once it answers.
pub fn serve_through(env: &Env, program: &str, args: &[&str]) -> u32 {
    let mut cmd = Command::new(program);
    cmd.args(args).args([bin(), "serve"]);
    let pid = env.start_daemon(cmd);
    assert!(cmdline(pid).ends_with("shinyctl serve"), "the daemon is the process started: {}", cmdline(pid));
    pid
}

/// Starts the daemon where no namespace can be made: in a user namespace
/// of its own whose limit of user namespaces is 0 (what
/// `user.max_user_namespaces = 0` does to a whole machine), with no
/// capabilities, so neither a mount namespace nor a nested user namespace
/// can be had.
pub fn serve_without_namespaces(env: &Env) -> u32 {
    let script = "echo 0 > /proc/sys/user/max_user_namespaces && exec setpriv --bounding-set=-all --inh-caps=-all \"$@\"";
    serve_through(env, "unshare", &["--user", "--map-root-user", "sh", "-c", script, "sh"])
}

/// The uid a process runs as, on the host.
fn uid_of(pid: u32) -> u32 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn an_unprivileged_daemons_copies_get_a_user_namespace_and_a_read_only_folder() {
    let env = Env::new("userns");
    let port = free_port();
    let (manifest, folder) = app_with(&env, "plain", port, PROBE_R);
    // Everything of the test belongs to nobody, who could write into the
    // app folder by its mode bits: only the mount stops it.
    let chown = Command::new("chown").args(["-R", "65534:65534"]).arg(&env.dir).status().unwrap();
    assert!(chown.success());
    let before = listing(&folder);
    let daemon = serve_through(&env, "setpriv", &["--reuid=65534", "--regid=65534", "--clear-groups"]);
    assert_eq!(uid_of(daemon), 65534, "the daemon is unprivileged");
    let page = deploy(&env, "plain", &manifest, port);

    assert_eq!(uid_of(env.pid_of("plain", 1)), 65534, "the copy keeps the daemon's uid on the host");
    let iso = isolation(&env, "plain");
    assert_eq!(iso["kind"], "mount-namespace", "{iso}");
    assert_eq!(between(&page, "wd=", ";"), Some("/shinyctl/app"), "{page}");
    assert_folder_kept_scratch_written(&env, "plain", &page, &folder, &before);
    wait_log(&env, "default-plain.log", "Read-only file system");
}

#[test]
fn without_namespaces_landlock_keeps_the_folder_unwritten() {
    let env = Env::new("landlock");
    serve_without_namespaces(&env);
    let port = free_port();
    let (manifest, folder) = app_with(&env, "fenced", port, PROBE_R);
    let before = listing(&folder);
    let page = deploy(&env, "fenced", &manifest, port);

    let iso = isolation(&env, "fenced");
    assert_eq!(iso["kind"], "landlock", "{iso}");
    assert!(iso["reason"].as_str().unwrap().contains("user.max_user_namespaces is 0"), "{iso}");
    // No namespace: the host's path of the folder the copy runs, its release.
    let release = env.status()["apps"][0]["copies"][0]["release"].as_str().expect("the copy's release").to_string();
    let host_folder = std::fs::canonicalize(env.home().join("releases/default/fenced").join(release)).unwrap();
    assert_eq!(between(&page, "wd=", ";"), Some(host_folder.to_str().unwrap()), "no namespace: the host's path: {page}");
    assert_folder_kept_scratch_written(&env, "fenced", &page, &folder, &before);
    let log = wait_log(&env, "default-fenced.log", "Permission denied");
    assert!(log.contains("isolation: Landlock (no mount namespace: user namespaces are switched off here"), "{log}");
}

/// A manifest's lines for one copy with the fence off.
const OFF: &str = "warm-replicas: 0\nsandbox:\n  mode: off\n";

/// An app whose page says where R's `tempdir()` is, and R's PID.
const TEMPDIR_R: &str = r#"
library(shiny)
ui <- fluidPage(tags$p(paste0("tmp=", tempdir(), ";")), tags$p(paste0("pid=", Sys.getpid(), ";")))
shinyApp(ui, function(input, output) {})
"#;

/// Deploys `name` with TEMPDIR_R and checks that its R keeps `tempdir()`
/// in the copy's own folder beside its scratch disk, not in the host's
/// /tmp, and that the one a SIGKILLed R leaves goes at the copy's next
/// start. Returns the folder.
fn tempdir_is_the_copy_s_own(env: &Env, name: &str, extra: &str) -> PathBuf {
    let port = free_port();
    let manifest = env.app_running(TEMPDIR_R, name, port, extra);
    deployed_tempdir_is_the_copy_s_own(env, name, &manifest, port)
}

/// [`tempdir_is_the_copy_s_own`] for an app folder written already.
fn deployed_tempdir_is_the_copy_s_own(env: &Env, name: &str, manifest: &Path, port: u16) -> PathBuf {
    let page = deploy(env, name, manifest, port);
    let own = std::fs::canonicalize(env.home().join(format!("scratch/default-{name}/1.tmp"))).unwrap();
    let tmp = PathBuf::from(between(&page, "tmp=", ";").unwrap_or_default());
    assert_eq!(tmp.parent(), Some(own.as_path()), "{name}: R's tempdir() in the copy's own folder: {page}");
    assert!(tmp.file_name().is_some_and(|n| n.to_string_lossy().starts_with("Rtmp")), "{page}");
    let r: u32 = between(&page, "pid=", ";").and_then(|p| p.parse().ok()).expect("R's PID on the page");
    killed_r_leaves_no_tempdir(env, name, r);
    own
}

/// README, "The fence": a copy without a /tmp of its own (the Landlock
/// fallback, `sandbox.mode: off`) has R keep its `tempdir()` in a folder of
/// the copy's own beside its scratch disk, never the host's /tmp, and the
/// one a killed R leaves goes at the copy's next start; a `TMPDIR` in the
/// manifest's `env` is kept.
#[test]
fn without_a_mount_namespace_r_s_tempdir_is_the_copy_s_own() {
    let env = Env::new("owntmp");
    serve_without_namespaces(&env);
    tempdir_is_the_copy_s_own(&env, "landtmp", "warm-replicas: 0\n");
    tempdir_is_the_copy_s_own(&env, "offtmp", OFF);
    let chosen = env.dir.join("chosen-tmp");
    std::fs::create_dir_all(&chosen).unwrap();
    let port = free_port();
    let manifest = env.app_running(TEMPDIR_R, "keptmp", port, &format!("{OFF}env:\n  TMPDIR: \"{}\"\n", chosen.display()));
    let page = deploy(&env, "keptmp", &manifest, port);
    let tmp = PathBuf::from(between(&page, "tmp=", ";").unwrap_or_default());
    assert_eq!(tmp.parent(), Some(chosen.as_path()), "the manifest's TMPDIR is kept: {page}");
    let own = env.home().join("scratch/default-keptmp/1.tmp");
    assert!(!own.exists(), "no folder of its own made: {}", own.display());
}

/// The same for a `mode: off` copy under a root daemon and under a daemon
/// that is not root (the folder is the daemon's user's). (With `run-as`, a
/// `mode: off` copy cannot start at all: its release, under the root
/// daemon's home, is not the run-as user's to read.)
#[test]
fn a_mode_off_copy_s_tempdir_is_its_own_under_root_and_unprivileged_daemons() {
    use std::os::unix::fs::MetadataExt;
    let env = Env::new("owntmp-root");
    let own = tempdir_is_the_copy_s_own(&env, "roottmp", OFF);
    assert_eq!(std::fs::metadata(&own).unwrap().uid(), 0, "the folder is the daemon's user's");

    let env = Env::new("owntmp-nobody");
    let port = free_port();
    let manifest = env.app_running(TEMPDIR_R, "nobodytmp", port, OFF);
    let chown = Command::new("chown").args(["-R", "65534:65534"]).arg(&env.dir).status().unwrap();
    assert!(chown.success());
    serve_through(&env, "setpriv", &["--reuid=65534", "--regid=65534", "--clear-groups"]);
    let own = deployed_tempdir_is_the_copy_s_own(&env, "nobodytmp", &manifest, port);
    assert_eq!(std::fs::metadata(&own).unwrap().uid(), 65534, "the folder is the daemon's user's");
}

#[test]
fn bad_launcher_arguments_exit_with_the_launchers_own_status() {
    let out = Command::new(bin()).args(["launch", "--port", "20001"]).output().unwrap();
    assert_eq!(out.status.code(), Some(121), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("the copy could not be launched: bad arguments") && err.contains("--spec"), "{err}");
}

/// The copy's init tells its launcher's standard input, once, the moment R
/// listens on the copy's port (the ports fence answers the `listen`): the
/// word on which the daemon asks the port at once rather than at its next
/// look (README, "Sleep"). A stand-in for R listens when the test says so.
#[test]
fn the_init_says_the_moment_r_listens_and_not_before() {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    let env = Env::new("told");
    let port = free_port();
    let app = env.dir.join("app");
    std::fs::create_dir_all(&app).unwrap();
    std::fs::write(app.join("app.R"), "").unwrap();
    let scratch = env.dir.join("scratch");
    std::fs::create_dir_all(&scratch).unwrap();
    // Outside /tmp, which the copy has its own of.
    let go = PathBuf::from(format!("/var/tmp/shinyctl-it-{}-told-go", std::process::id()));
    let _ = std::fs::remove_file(&go);
    let r = env.script(
        "stand-in-R",
        &format!(
            "while [ ! -e {} ]; do sleep 0.05; done\nexec python3 -c 'import socket, time; s = socket.socket(); s.bind((\"127.0.0.1\", {port})); s.listen(); time.sleep(60)'\n",
            go.display()
        ),
    );
    let manifest = app.join("app.yaml");
    let spec = shinyctl::manifest::parse(&manifest, &format!("app-name: told\nport: 1\nr-path: {}\n", r.display())).unwrap();
    let launch = shinyctl::wire::launch::Launch {
        home: env.home(),
        app: "told".into(),
        copy: 1,
        port,
        app_dir: app.clone(),
        scratch,
        uid: None,
        cgroups: Vec::new(),
        pool: None,
        cold: None,
        start: spec.start,
    };
    let (said, tell) = nix::unistd::pipe().unwrap();
    let mut child = Command::new(bin())
        .arg("launch")
        .args(launch.args())
        .stdin(std::process::Stdio::from(tell))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    env.track(child.id());
    std::thread::spawn(move || child.wait());
    nix::fcntl::fcntl(said.as_raw_fd(), nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK)).unwrap();
    let mut said = std::fs::File::from(said);
    let mut byte = [0u8; 8];
    let mut read = || match said.read(&mut byte) {
        Ok(n) => Some(byte[..n].to_vec()),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => None,
        Err(e) => panic!("the launcher's stdin: {e}"),
    };
    holds_for(Duration::from_secs(1), "no word while R does not listen", || read().is_none());
    std::fs::write(&go, "").unwrap();
    let word = wait_until(Duration::from_secs(20), "the init's word that R listens", &mut read);
    assert_eq!(word, b"l", "one byte");
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(), "R listens once the word came");
    holds_for(Duration::from_millis(500), "the word comes once", || read().is_none());
    let _ = std::fs::remove_file(&go);
}

/// The daemon takes the init's word: a fenced copy of a real R app is
/// found ready on it, as api.log says at debug level.
#[test]
fn the_daemon_asks_the_port_on_the_inits_word() {
    let env = Env::new("toldd");
    let mut cmd = Command::new(bin());
    cmd.arg("serve").env("SHINYCTL_LOG", "debug");
    env.start_daemon(cmd);
    let app = unique("toldd");
    env.started(&app, "warm-replicas: 0\n", "1:active");
    let log = std::fs::read_to_string(env.home().join("api.log")).unwrap();
    assert!(log.contains("the copy's init says R listens") && log.contains("listening=true"), "{log}");
}
