//! The fence's limits with real R (issue #9): a copy that grows past
//! `sandbox.memory` is stopped, counted as a crash, restarted after the
//! backoff, and the line under status says so; a copy under its limit
//! keeps running; bad sandbox values are refused; changing the limit
//! redeploys.

use std::time::Duration;

use crate::helpers::*;

/// A request with `?grow` makes the copy hold 500 MB, 20 MB at a time
/// (touched, so resident), a little at a time so a watch every 250 ms sees
/// it grow; any other request allocates nothing. Only once per copy (a
/// marker on its own disk, which a restart keeps): the load balancer sends
/// a request held while the copy was down to it again when it is back.
const HOG_R: &str = r#"
library(shiny)
hog <- list()
grown <- file.path(Sys.getenv("SHINYCTL_SCRATCH"), "grown")
ui <- function(req) {
  if (grepl("grow", req$QUERY_STRING) && !file.exists(grown)) {
    writeLines("x", grown)
    for (i in 1:25) {
      hog[[length(hog) + 1]] <<- runif(20 * 1024 * 1024 / 8)
      Sys.sleep(0.05)
    }
  }
  fluidPage(tags$p(paste0("copy=", Sys.getenv("SHINYCTL_COPY"), ";")))
}
shinyApp(ui, function(input, output) {})
"#;

/// An app of one copy running [`HOG_R`] with `sandbox.memory: memory`, on a
/// free port; returns the port and the manifest (not applied).
fn hog_app(env: &Env, name: &str, memory: &str) -> (u16, std::path::PathBuf) {
    let port = free_port();
    let manifest = env.app_running(HOG_R, name, port, &format!("warm-replicas: 0\nsandbox:\n  memory: {memory}\n"));
    (port, manifest)
}

/// The memory limit the kernel keeps for a process, from its cgroup (v1's
/// memory.limit_in_bytes or v2's memory.max); none outside a memory cgroup.
fn kernel_memory_limit(pid: u32) -> Option<String> {
    let own = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let v1 = own.lines().find_map(|l| l.split_once(":memory:").map(|(_, p)| p.to_string()));
    let file = match v1 {
        Some(p) => format!("/sys/fs/cgroup/memory{p}/memory.limit_in_bytes"),
        None => format!("/sys/fs/cgroup{}/memory.max", own.lines().find_map(|l| l.strip_prefix("0::"))?),
    };
    std::fs::read_to_string(file).ok().map(|s| s.trim().to_string())
}

/// The cgroup folder of one controller (`memory`, `pids`) a process is in:
/// v1's `/sys/fs/cgroup/<controller><path>`, or v2's one hierarchy.
fn cgroup_dir(pid: u32, controller: &str) -> Option<std::path::PathBuf> {
    let own = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    match own.lines().find_map(|l| l.split_once(&format!(":{controller}:")).map(|(_, p)| p.to_string())) {
        Some(p) => Some(std::path::PathBuf::from(format!("/sys/fs/cgroup/{controller}{p}"))),
        None => Some(std::path::PathBuf::from(format!("/sys/fs/cgroup{}", own.lines().find_map(|l| l.strip_prefix("0::"))?))),
    }
}

/// True where the copies must get memory and pids cgroups: the suite runs
/// as root (as CI does) on a machine with a cgroup v2 hierarchy that offers
/// both controllers, or with cgroup v1's memory and pids hierarchies
/// mounted. There a limit missing from the kernel fails the test instead
/// of being skipped.
fn cgroups_expected() -> bool {
    let root = std::path::Path::new("/sys/fs/cgroup");
    let v2 = std::fs::read_to_string(root.join("cgroup.controllers"))
        .is_ok_and(|c| c.split_whitespace().any(|x| x == "memory") && c.split_whitespace().any(|x| x == "pids"));
    let v1 = ["memory", "pids"].iter().all(|c| root.join(c).join("cgroup.procs").exists());
    is_root() && (v2 || v1)
}

/// The tasks limit the kernel keeps for a process (its pids cgroup).
fn kernel_tasks_limit(pid: u32) -> Option<String> {
    let own = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let file = match own.lines().find_map(|l| l.split_once(":pids:").map(|(_, p)| p.to_string())) {
        Some(p) => format!("/sys/fs/cgroup/pids{p}/pids.max"),
        None => format!("/sys/fs/cgroup{}/pids.max", own.lines().find_map(|l| l.strip_prefix("0::"))?),
    };
    std::fs::read_to_string(file).ok().map(|s| s.trim().to_string())
}

#[test]
fn a_copy_over_its_memory_limit_is_stopped_counted_as_a_crash_and_comes_back() {
    let env = Env::new("limits-memory");
    let (port, manifest) = hog_app(&env, "hog", "200M");
    env.apply(&manifest);
    env.wait_roles("hog", "1:active", Duration::from_secs(60));
    wait_http_ok(port, Duration::from_secs(10));
    let first = env.pid_of("hog", 1);
    let log = std::fs::read_to_string(env.home().join("api.log")).unwrap();
    let in_cgroup = !log.contains("copies' limits: no cgroup");
    assert_eq!(in_cgroup, cgroups_expected(), "the copies get cgroups exactly where they can: {log}");
    if cgroups_expected() {
        assert_eq!(kernel_memory_limit(first).as_deref(), Some((200u64 << 20).to_string().as_str()), "{log}");
        assert_eq!(kernel_tasks_limit(first).as_deref(), Some("512"), "the default sandbox.tasks");
    }

    // Under its limit it keeps running.
    assert_eq!(get(port, "/", &[]).unwrap().status, 200);
    holds_for(Duration::from_secs(2), "copy 1 to keep running under its limit", || {
        pid_alive(first) && env.copies("hog").iter().all(|c| c.crashes == 0)
    });

    // Past it: stopped, a crash, and the line under the table.
    let _ = get(port, "/?grow", &[]);
    wait_gone(first, Duration::from_secs(30), "the copy over its memory limit to be stopped");
    let text = wait_until(Duration::from_secs(30), "the status line about the memory limit", || {
        let text = env.ok(&["status", "hog"]);
        text.contains("hog: copy 1 was stopped: ").then_some(text)
    });
    assert!(text.contains(", over its memory limit of 200M (once)."), "{text}");
    let crashes = env.copies("hog")[0].crashes;
    assert_eq!(crashes, 1, "counted as a crash");
    let state = env.record("hog", 1).unwrap();
    assert!(state["last_exit"]["memory"]["limit"] == 200u64 << 20, "state.json records why: {state}");

    // Restarted after the backoff, as another process, with the line still there.
    env.wait_roles("hog", "1:active", Duration::from_secs(60));
    let second = env.pid_of("hog", 1);
    assert_ne!(second, first);
    assert!(env.ok(&["status", "hog"]).contains("over its memory limit of 200M"));
    assert_eq!(get(port, "/", &[]).unwrap().status, 200);

    // The metrics count it once, as a memory-limit restart and not a crash.
    let (_, metrics) = shinyctl::wire::uds::request_blocking(
        &env.home().join("api.sock"),
        hyper::Method::GET,
        "/v1/metrics",
        None,
        Duration::from_secs(10),
    )
    .expect("api.sock answers");
    let metrics = String::from_utf8_lossy(&metrics);
    for (reason, want) in [("memory-limit", "1"), ("crash", "0")] {
        let series = format!("shinyctl_restarts_total{{app=\"hog\",reason=\"{reason}\"}} {want}");
        assert!(metrics.lines().any(|l| l == series), "{series} in:\n{metrics}");
    }
}

#[test]
fn bad_sandbox_values_are_refused_and_a_new_limit_redeploys() {
    let env = Env::new("limits-redeploy");
    let port = free_port();
    let manifest = env.app("fenced", port, "warm-replicas: 0\nsandbox:\n  memory: 300M\n  tasks: 200\n");
    env.apply(&manifest);
    env.wait_roles("fenced", "1:active", Duration::from_secs(60));
    let first = env.pid_of("fenced", 1);

    // Refused whole, with file, line and key; nothing running changes.
    let path = manifest.to_str().unwrap();
    for (bad, want) in [
        ("  memory: 10M\n", format!("{path}:6: sandbox.memory: 10M is too little for R to start")),
        ("  memroy: 1G\n", format!("{path}:6: sandbox.memroy: unknown key")),
        ("  tasks: 3\n  open-files: 10\n", format!("{path}:6: sandbox.tasks: 3 is too few")),
    ] {
        std::fs::write(&manifest, format!("app-name: fenced\nport: {port}\nwarm-replicas: 0\nsandbox:\n  mode: on\n{bad}")).unwrap();
        let out = env.run(&["apply", "-f", path]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(&want), "want {want:?} in: {err}");
    }
    std::fs::write(&manifest, format!("app-name: fenced\nport: {port}\nrun-as: no-such-user-here\n")).unwrap();
    let out = env.run(&["apply", "-f", path]);
    assert!(String::from_utf8_lossy(&out.stderr).contains(&format!("{path}:3: run-as: there is no user")));
    assert_eq!(env.pid_of("fenced", 1), first, "nothing running changed");

    // A new memory limit is a new way to start: new copies replace the old.
    std::fs::write(&manifest, format!("app-name: fenced\nport: {port}\nwarm-replicas: 0\nsandbox:\n  memory: 400M\n  tasks: 200\n"))
        .unwrap();
    env.apply(&manifest);
    env.wait_roles("fenced", "2:active", Duration::from_secs(60));
    wait_gone(first, Duration::from_secs(30), "the copy with the old limit to stop");
    let second = env.pid_of("fenced", 2);
    if !cgroups_expected() {
        return;
    }
    assert_eq!(kernel_memory_limit(second).as_deref(), Some((400u64 << 20).to_string().as_str()));
    assert_eq!(kernel_tasks_limit(second).as_deref(), Some("200"));
    // Its old copy's cgroups are gone with it: the copies' cgroups are
    // siblings, `<app>-<copy>`.
    for controller in ["memory", "pids"] {
        let dir = cgroup_dir(second, controller).unwrap_or_else(|| panic!("copy 2's {controller} cgroup"));
        assert!(dir.ends_with("fenced-2") && dir.is_dir(), "copy 2 is in its own {controller} cgroup: {}", dir.display());
        let old = dir.with_file_name("fenced-1");
        wait_until(Duration::from_secs(10), "copy 1's cgroup to be removed", || (!old.exists()).then_some(()));
    }
}

/// On each request for `/?fork`, R starts `sleep` processes until the
/// system refuses one (or 300), and logs the count after each start and
/// what the shell said.
const FORKER_R: &str = r#"
library(shiny)
ui <- function(req) {
  if (grepl("fork", req$QUERY_STRING)) {
    out <- suppressWarnings(system2("/bin/sh", c("-c", shQuote("i=0; while [ $i -lt 300 ]; do sleep 20 & i=$((i+1)); echo n=$i; done")),
      stdout = TRUE, stderr = TRUE))
    message("FORKER ", paste(out, collapse = " | "))
  }
  fluidPage(tags$p(paste0("copy=", Sys.getenv("SHINYCTL_COPY"), ";")))
}
shinyApp(ui, function(input, output) {})
"#;

/// `sandbox.tasks` is kept by the kernel: R forks past it and is refused.
#[test]
fn a_copy_cannot_fork_past_its_tasks_limit() {
    if !cgroups_expected() {
        // Not root (a failure, or SKIPPED), or root on a machine without a pids cgroup.
        assert!(!needs_root("a pids cgroup keeps sandbox.tasks"), "root, and no pids cgroup: sandbox.tasks cannot be kept here");
        return;
    }
    let env = Env::new("limits-tasks");
    let port = free_port();
    let manifest = env.app_running(FORKER_R, "forker", port, "warm-replicas: 0\nsandbox:\n  tasks: 48\n");
    env.apply(&manifest);
    env.wait_roles("forker", "1:active", Duration::from_secs(60));
    wait_http_ok(port, Duration::from_secs(10));
    let r = env.pid_of("forker", 1);
    assert_eq!(kernel_tasks_limit(r).as_deref(), Some("48"), "the kernel keeps the limit");
    let _ = get(port, "/?fork", &[]);
    let log_path = env.home().join("logs/default-forker.log");
    let line = wait_until(Duration::from_secs(60), "the forks' outcome in the copy's log", || {
        std::fs::read_to_string(&log_path).ok()?.lines().find(|l| l.contains("FORKER ")).map(str::to_string)
    });
    // The last `n=` before the shell's refusal: how many started.
    let started: u32 = line.rsplit("n=").next().and_then(|n| n.split(' ').next()).and_then(|n| n.parse().ok()).unwrap_or(0);
    assert!(started > 0, "some started: {line}");
    assert!(started < 48, "fewer processes started than the limit: {line}");
    assert!(line.contains("Cannot fork"), "the shell was refused a fork: {line}");
}

/// `curl ARGS URL` run as `nobody` (CI runs as root) against a Unix
/// socket; returns its body and status code (`000` when no answer came).
fn curl_as_nobody(sock: &std::path::Path, args: &[&str], url: &str) -> String {
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "curl", "-s", "-w", " %{http_code}", "--max-time", "5"])
        .args(args)
        .arg("--unix-socket")
        .arg(sock)
        .arg(url)
        .output()
        .expect("setpriv and curl run");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_control_sockets_refuse_a_peer_of_another_user() {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::new("limits-peercred");
    let port = env.started("peers", "warm-replicas: 0\n", "1:active");
    // Modes out of the way, so that only the peer check stands between
    // another user and the sockets (as on a machine where a copy sees them).
    let home = env.home();
    let open = |p: &std::path::Path, mode| std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    open(&env.dir, 0o755);
    open(&home, 0o755);
    open(&home.join("proxy"), 0o755);
    for sock in ["api.sock", "proxy/proxy.sock", "proxy/handover.sock"] {
        open(&home.join(sock), 0o666);
    }
    let api = curl_as_nobody(&home.join("api.sock"), &[], "http://shinyctl/v1/status");
    assert!(api.ends_with(" 403") && api.contains("runs as uid 65534"), "api.sock: {api}");
    let table = curl_as_nobody(&home.join("proxy/proxy.sock"), &["-X", "PUT", "-d", r#"{"apps":[]}"#], "http://shinyctl/table");
    assert!(table.ends_with(" 403"), "proxy.sock: {table}");
    let handover = curl_as_nobody(&home.join("proxy/handover.sock"), &[], "http://shinyctl/");
    assert!(handover.ends_with(" 000"), "handover.sock hands nothing over and says nothing: {handover}");
    wait_until(Duration::from_secs(10), "the load balancer to log the refusal", || {
        std::fs::read_to_string(home.join("api.log")).unwrap().contains("handover.sock refused").then_some(())
    });
    // The table was not emptied, and our own user is still answered.
    assert_eq!(get(port, "/", &[]).unwrap().status, 200);
    assert_eq!(env.roles("peers"), "1:active");
}

#[test]
fn without_a_cgroup_the_daemons_watch_stops_a_copy_over_its_memory_limit() {
    let env = Env::new("limits-watch");
    let (port, manifest) = hog_app(&env, "watched", "250M");
    // The daemon starts with the first apply, with cgroups switched off.
    let out = std::process::Command::new(bin())
        .args(["apply", "-f", manifest.to_str().unwrap()])
        .env("SHINYCTL_HOME", env.home())
        .env("SHINYCTL_CGROUPS", "off")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    env.wait_roles("watched", "1:active", Duration::from_secs(60));
    let log = std::fs::read_to_string(env.home().join("api.log")).unwrap();
    assert!(log.contains("copies' limits: no cgroup; missing: switched off by SHINYCTL_CGROUPS=off"), "{log}");
    let limits = &env.status()["limits"];
    assert_eq!((limits["memory"].as_str(), limits["tasks"].as_str()), (Some("watch"), Some("not kept")), "{limits}");
    assert!(limits["missing"].as_str().unwrap().contains("SHINYCTL_CGROUPS=off"), "{limits}");
    let first = env.pid_of("watched", 1);
    assert_eq!(kernel_memory_limit(first).filter(|l| l != "max" && !l.starts_with("9223372")), None, "no kernel limit of its own");

    let _ = get(port, "/?grow", &[]);
    wait_gone(first, Duration::from_secs(30), "the watch to stop the copy over its memory limit");
    let text = wait_until(Duration::from_secs(30), "the status line about the memory limit", || {
        let text = env.ok(&["status", "watched"]);
        text.contains("watched: copy 1 was stopped: ").then_some(text)
    });
    // The watch sees the copy past its limit, not at it: more than 250M.
    let used = text.split("was stopped: ").nth(1).and_then(|r| r.split(',').next()).unwrap();
    let bytes = shinyctl::manifest::parse_size(used).unwrap_or_else(|| panic!("{used:?} is a size: {text}"));
    assert!(bytes > 250 << 20 && bytes < 600 << 20, "{text}");
    assert!(text.contains(", over its memory limit of 250M (once)."), "{text}");
    env.wait_roles("watched", "1:active", Duration::from_secs(60));
    assert_ne!(env.pid_of("watched", 1), first);
}
