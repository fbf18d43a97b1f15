//! An operator's day with real R, as a person types it: deploys that tell
//! the truth (`--wait`), a broken edit deployed to a sleeping app that never
//! reaches a visitor.

use std::time::Duration;

use crate::helpers::*;

/// An app whose page says which version it is.
fn versioned(version: &str) -> String {
    format!("library(shiny)\nshinyApp(fluidPage(tags$p(\"version={version};\")), function(input, output) {{}})\n")
}

/// The version a page of the app says.
fn version_served(port: u16) -> String {
    let page = wait_http_ok(port, Duration::from_secs(60)).body;
    between(&page, "version=", ";").unwrap_or_else(|| panic!("a versioned page: {page}")).to_string()
}

#[test]
fn a_broken_edit_deployed_to_a_sleeping_app_never_reaches_a_visitor_and_wait_says_so() {
    let env = Env::new("opsleep");
    let app = unique("opsleep");
    let port = free_port();
    let manifest = env.app_running(&versioned("v1"), &app, port, "warm-replicas: 0\nidle-timeout: 3s\n");
    let out = env.ok(&["apply", "-f", manifest.to_str().unwrap(), "--wait=90s"]);
    // With a short idle-timeout it may be asleep again by the time it is seen.
    assert!(out.contains(" serves (1 active)") || out.contains("the app sleeps on it"), "apply --wait returns once the app serves: {out}");
    assert_eq!(version_served(port), "v1");
    env.wait_asleep(&app, Duration::from_secs(90));

    // The broken edit, in place, then restart as the docs say.
    let app_r = manifest.with_file_name("app.R");
    let mut text = std::fs::read_to_string(&app_r).unwrap();
    text.push_str("stop(\"broken edit\")\n");
    std::fs::write(&app_r, text).unwrap();
    let out = env.run(&["restart", &app, "--wait=90s"]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success(), "restart --wait fails for a broken version: {stdout}\n{stderr}");
    assert!(stdout.contains("the app is asleep: one copy of the new version starts to check it"), "restart says what it does: {stdout}");
    assert!(stderr.contains("the version before still serves") && stderr.contains("broken edit"), "the copy's last error: {stderr}");
    assert!(stderr.contains(&format!("logs/default-{app}@2.log")), "and its log: {stderr}");
    let status = env.ok(&["status", &app]);
    assert!(status.contains("never got ready") && status.contains("asleep"), "{status}");

    // The check's end was a crash, not a stop of shinyctl's.
    let check_log = std::fs::read_to_string(env.home().join(format!("logs/default-{app}@2.log"))).unwrap_or_default();
    assert!(check_log.contains("(crash)") && !check_log.contains("stopped by shinyctl"), "{check_log}");

    // The next visitor wakes the version before, and the app, idle, sleeps
    // again: the failed deploy does not keep it awake.
    assert_eq!(version_served(port), "v1", "a broken edit never reaches a visitor");
    env.wait_asleep(&app, Duration::from_secs(90));

    // The fix, deployed the same way, is checked and the app sleeps on it.
    std::fs::write(&app_r, versioned("v2")).unwrap();
    let out = env.ok(&["restart", &app, "--wait=90s"]);
    assert!(out.contains("the app sleeps on it"), "{out}");
    assert_eq!(version_served(port), "v2", "it wakes with the checked version");
    // Stopped while asleep: no copy to stop, and it says so.
    env.wait_asleep(&app, Duration::from_secs(90));
    wait_until(Duration::from_secs(30), "the sleeping copies' processes to end", || {
        env.copies(&app).iter().all(|c| c.pid.is_none()).then_some(())
    });
    let out = env.ok(&["stop", &app]);
    assert!(out.contains(&format!("{app}: asleep, no copy runs; port {port} stays held")), "{out}");
    env.ok(&["start", &app]);

    // Asleep again, another good edit, checked the same way; and one more
    // while it sleeps on that one, never woken in between.
    env.wait_asleep(&app, Duration::from_secs(90));
    std::fs::write(&app_r, versioned("v3")).unwrap();
    let out = env.ok(&["restart", &app, "--wait=90s"]);
    assert!(out.contains("the app sleeps on it"), "{out}");
    assert!(env.copies(&app).iter().all(|c| c.status == "asleep"), "asleep after the check");
    std::fs::write(&app_r, versioned("v4")).unwrap();
    let out = env.ok(&["restart", &app, "--wait=90s"]);
    assert!(out.contains("the app sleeps on it"), "{out}");

    // An apply that changes nothing has nothing to wait for.
    let out = env.ok(&["apply", "-f", manifest.to_str().unwrap(), "--wait"]);
    assert!(out.contains("nothing to wait for"), "{out}");

    // A check that was ready served, though no visitor saw it: each kept
    // release served (the broken one is past keep-releases), and a
    // rollback goes back to v3.
    let releases = env.ok(&["releases", &app]);
    assert!(!releases.contains("never ready"), "{releases}");
    let out = env.ok(&["rollback", &app, "--wait=90s"]);
    assert!(out.contains("serves") || out.contains("the app sleeps on it"), "{out}");
    assert_eq!(version_served(port), "v3", "rolled back to the release that served before");
}

/// The copies `proxy/table.json` (what the load balancer was last given)
/// names active for `app`.
fn active_in_table(env: &Env, app: &str) -> Vec<u32> {
    let text = std::fs::read_to_string(env.home().join("proxy").join("table.json")).unwrap_or_default();
    let table: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    let Some(entry) = table["apps"].as_array().into_iter().flatten().find(|a| a["name"] == app) else { return Vec::new() };
    entry["copies"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["role"] == "active")
        .filter_map(|c| c["copy"].as_u64())
        .map(|c| c as u32)
        .collect()
}

#[test]
fn apply_wait_and_status_say_a_copy_serves_only_once_the_load_balancer_routes_to_it() {
    let env = Env::new("opsync");
    let app = unique("opsync");
    let port = free_port();
    let manifest = env.app_running(&versioned("v1"), &app, port, "warm-replicas: 0\n");
    env.ok(&["apply", "-f", manifest.to_str().unwrap(), "--wait=90s"]);
    assert_eq!(version_served(port), "v1");
    // A load balancer slow to take a table: stopped 200 ms in every 203,
    // so a push most often waits for it (well within the push's own
    // timeout), as the daemon's figures do: the cycle that records the
    // new copy's role is not held up waiting for them as well.
    let balancer = env.status()["proxy_pid"].as_u64().expect("a load balancer") as u32;
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let pausing = {
        let done = done.clone();
        std::thread::spawn(move || {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                signal(balancer, libc::SIGSTOP);
                std::thread::sleep(Duration::from_millis(200));
                signal(balancer, libc::SIGCONT);
                std::thread::sleep(Duration::from_millis(3));
            }
        })
    };
    let app_r = manifest.with_file_name("app.R");
    let mut seen = Vec::new();
    for version in ["v2", "v3"] {
        std::fs::write(&app_r, versioned(version)).unwrap();
        let out = env.run(&["restart", &app, "--wait=90s"]);
        // What the load balancer has, looked at the moment --wait returns.
        let table = active_in_table(&env, &app);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let active: Vec<u32> = env.copies(&app).iter().filter(|c| c.role == "active").map(|c| c.copy).collect();
        seen.push((version, table.clone(), active.clone()));
        assert!(
            !active.is_empty() && active.iter().all(|c| table.contains(c)),
            "--wait and status say {active:?} serve {version}; the load balancer's table names {table:?}"
        );
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    pausing.join().unwrap();
    signal(balancer, libc::SIGCONT);
    assert_eq!(version_served(port), "v3", "{seen:?}");
}

/// Writes an app folder of these files (name, text) and its manifest, with
/// no entrypoint-file: the folder's layout decides.
fn layout_app(env: &Env, name: &str, port: u16, files: &[(&str, &str)]) -> std::path::PathBuf {
    let folder = env.dir.join("apps").join(name);
    std::fs::create_dir_all(&folder).unwrap();
    for (file, text) in files {
        std::fs::write(folder.join(file), text).unwrap();
    }
    let manifest = folder.join("app.yaml");
    std::fs::write(&manifest, format!("app-name: {name}\nport: {port}\nwarm-replicas: 0\n")).unwrap();
    manifest
}

/// Shiny Server's and Connect's usual layout, `global.R` + `ui.R` +
/// `server.R`, runs fenced as `shiny::runApp(dir)` runs it: global.R first,
/// then the page from ui.R, and a session served by server.R.
#[test]
fn a_ui_and_server_app_runs_as_shiny_runs_it() {
    let env = Env::new("layoutuis");
    let app = unique("uiserver");
    let port = free_port();
    let manifest = layout_app(
        &env,
        &app,
        port,
        &[
            // What R was started with shows too: no trailing arguments,
            // not interactive, as under `R -e`.
            ("global.R", "greeting <- 'from global.R'\nstarted <- paste(length(commandArgs(TRUE)), interactive())\n"),
            ("ui.R", "library(shiny)\nfluidPage(tags$p(paste0('ui=', greeting, ';args=', started, ';')), textOutput('out'))\n"),
            ("server.R", "function(input, output, session) { output$out <- renderText('from server.R') }\n"),
        ],
    );
    let out = env.ok(&["apply", "-f", manifest.to_str().unwrap(), "--wait=90s"]);
    assert!(out.contains("serves"), "{out}");
    let page = wait_http_ok(port, Duration::from_secs(30)).body;
    assert_eq!(between(&page, "ui=", ";"), Some("from global.R"), "global.R ran before ui.R: {page}");
    assert_eq!(between(&page, "args=", ";"), Some("0 FALSE"), "R's trailing arguments and interactive(): {page}");
    let status = env.status();
    assert_eq!(status["apps"][0]["copies"][0]["isolation"]["kind"], "mount-namespace", "fenced: {status}");
}

/// An R Markdown document with `runtime: shiny`, the folder's only
/// document, runs through rmarkdown::run, fenced: rendered into the copy's
/// own disk (its release is read-only).
#[test]
fn an_r_markdown_document_with_runtime_shiny_runs() {
    let env = Env::new("layoutrmd");
    let app = unique("rmd");
    let port = free_port();
    let doc = "---\ntitle: \"Report\"\nruntime: shiny\noutput: html_document\n---\n\nThe rendered-marker paragraph.\n\n```{r, echo=FALSE}\nsliderInput('n', 'N', 1, 10, 5)\nrenderText(paste('n is', input$n))\n```\n";
    let manifest = layout_app(&env, &app, port, &[("report.Rmd", doc)]);
    let out = env.ok(&["apply", "-f", manifest.to_str().unwrap(), "--wait=120s"]);
    assert!(out.contains("serves"), "{out}");
    let page = wait_http_ok(port, Duration::from_secs(60)).body;
    assert!(page.contains("rmd_loader.js"), "rmarkdown's page, which loads the document through a Shiny session: {page}");
    let rendered = rendered_document(port);
    assert!(rendered.contains("The rendered-marker paragraph.") && rendered.contains("Report"), "the document, rendered: {rendered}");
    let release = env.home().join("releases/default").join(&app);
    let files: Vec<String> = walk(&release);
    assert!(!files.iter().any(|f| f.ends_with(".html")), "nothing rendered into the release: {files:?}");
}

/// Every file below `dir`.
fn walk(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p.display().to_string());
        }
    }
    out
}

/// What a Shiny session of an R Markdown document receives until the
/// rendered document arrives (rmarkdown's loader asks for it over the
/// session's WebSocket, as a browser does).
fn rendered_document(port: u16) -> String {
    use tungstenite::client::IntoClientRequest;
    let stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let req = format!("ws://127.0.0.1:{port}/websocket/").into_client_request().unwrap();
    let (mut socket, _) = tungstenite::client(req, stream).expect("a WebSocket to the document");
    // The document is the output `__reactivedoc__`, sent once it shows.
    socket.send(tungstenite::Message::text(r#"{"method":"init","data":{".clientdata_output___reactivedoc___hidden":false}}"#)).unwrap();
    let mut seen = String::new();
    let end = std::time::Instant::now() + Duration::from_secs(60);
    while !seen.contains("rendered-marker") {
        assert!(std::time::Instant::now() < end, "no document within 60 s; got: {seen}");
        match next_text(&mut socket) {
            Ok(text) => seen.push_str(&text),
            Err(e) => panic!("the session ended before the document came: {e}; got: {seen}"),
        }
    }
    let _ = socket.close(None);
    seen
}

/// An app that sleeps an hour before `shinyApp()` is stopped at
/// start-timeout, counted as a crash, with the reason in status and in its
/// own log; `apply --wait` fails with it.
#[test]
fn a_copy_not_ready_within_start_timeout_is_stopped_and_said() {
    let env = Env::new("opstartto");
    let app = unique("slowstart");
    let port = free_port();
    let slow = "Sys.sleep(3600)\nshiny::shinyApp(shiny::fluidPage('never'), function(input, output) {})\n";
    let manifest = env.app_running(slow, &app, port, "warm-replicas: 0\nstart-timeout: 3s\n");
    let out = env.run(&["apply", "-f", manifest.to_str().unwrap(), "--wait=60s"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "apply --wait fails: {stderr}");
    assert!(stderr.contains("not ready within start-timeout 3s"), "{stderr}");
    // Its first deploy: there is no version before it to serve.
    assert!(stderr.contains(&format!("no version of {app} serves")) && !stderr.contains("version before"), "{stderr}");
    let status = env.ok(&["status", &app]);
    assert!(status.contains("was stopped: not ready within start-timeout 3s"), "{status}");
    let log = std::fs::read_to_string(env.home().join(format!("logs/default-{app}.log"))).unwrap();
    assert!(log.contains("was not ready within start-timeout 3s; stopping it (counted as a crash)"), "{log}");
    let api = std::fs::read_to_string(env.home().join("api.log")).unwrap();
    assert!(api.contains("WARN") && api.contains("not ready within start-timeout"), "{api}");
}

/// `logs` shows the copies the app has now, each line prefixed with its
/// copy; `-f` follows across a redeploy onto the new copy; a copy's start
/// and end (with how and why) are in its own log; `--all` shows the ended
/// copies too; the daemon's log has a crash at WARN with the copy and R's
/// PID; `serve` in the foreground logs to stderr as well.
#[test]
fn logs_follow_the_app_across_a_redeploy_and_say_how_copies_ended() {
    let env = Env::new("oplogs");
    let stderr_file = env.dir.join("serve.stderr");
    let mut cmd = std::process::Command::new(bin());
    cmd.arg("serve");
    let serve = env.start_daemon_with_stderr(cmd, &stderr_file);
    let app = unique("talk");
    let port = free_port();
    let manifest = env.app(&app, port, "warm-replicas: 0\n");
    env.apply(&manifest);
    env.wait_roles(&app, "1:active", Duration::from_secs(60));
    let out = env.ok(&["logs", &app]);
    assert!(out.lines().any(|l| l.starts_with("copy 1 | ") && l.contains("Listening on http://127.0.0.1:")), "{out}");
    assert!(out.lines().any(|l| l.starts_with("copy 1 | --- shinyctl: copy 1 of") && l.contains(" starting on ")), "{out}");
    let out = env.ok(&["logs", &app, "-n", "1"]);
    assert_eq!(out.lines().count(), 1, "-n 1: one line per copy: {out}");

    // Followed from before the redeploy.
    let follow_out = env.dir.join("follow.out");
    let mut follower = std::process::Command::new(bin())
        .args(["logs", &app, "-f", "-n", "0"])
        .env("SHINYCTL_HOME", env.home())
        .stdout(std::fs::File::create(&follow_out).unwrap())
        .spawn()
        .unwrap();
    env.track(follower.id());
    env.ok(&["restart", &app, "--now", "--wait=60s"]);
    let followed = wait_until(Duration::from_secs(30), "the follower to show the new copy", || {
        let text = std::fs::read_to_string(&follow_out).ok()?;
        text.lines().any(|l| l.starts_with("copy 2 | ") && l.contains("Listening on")).then_some(text)
    });
    assert!(followed.lines().any(|l| l.starts_with("copy 2 | --- shinyctl: copy 2 of")), "{followed}");

    // R killed: its end in its own log, and at WARN in the daemon's, with the copy and R's PID.
    let r = env.pid_of(&app, 2);
    signal(r, 9);
    let followed = wait_until(Duration::from_secs(30), "the crash in the followed log", || {
        let text = std::fs::read_to_string(&follow_out).ok()?;
        text.lines().find(|l| l.starts_with("copy 2 | ") && l.contains("ended at")).map(|l| l.to_string())
    });
    assert!(followed.contains(&format!("(R's PID {r})")) && followed.contains("was killed by signal 9 (crash)"), "{followed}");
    let _ = follower.kill();
    let _ = follower.wait();
    let api = std::fs::read_to_string(env.home().join("api.log")).unwrap();
    let warn = api.lines().find(|l| l.contains("WARN") && l.contains("was killed by signal 9 (crash)")).unwrap_or_else(|| panic!("{api}"));
    assert!(warn.contains("copy=2") && warn.contains(&format!("r_pid={r}")), "{warn}");
    wait_until(Duration::from_secs(30), "the daemon's lines on its stderr", || {
        std::fs::read_to_string(&stderr_file).ok().filter(|t| t.contains("was killed by signal 9 (crash)")).map(|_| ())
    });

    // Copy 1 ended with the redeploy: only --all shows it, with its end.
    env.wait_roles(&app, "2:active", Duration::from_secs(60));
    let live = env.ok(&["logs", &app]);
    assert!(!live.lines().any(|l| l.starts_with("copy 1 |")), "only the live copies: {live}");
    let all = env.ok(&["logs", &app, "--all"]);
    assert!(all.lines().any(|l| l.starts_with("copy 1 |") && l.contains("ended at") && l.contains("(drained)")), "{all}");
    let first = |copy: &str| all.lines().position(|l| l.starts_with(copy)).unwrap_or(usize::MAX);
    assert!(first("copy 1 |") < first("copy 2 |"), "in start order, the copy that ended first: {all}");
    assert!(pid_alive(serve));
}

/// stop, start, scale, list, restart --all, shutdown and shutdown --all,
/// as an operator types them.
#[test]
fn stop_start_scale_list_restart_all_and_shutdown() {
    let env = Env::new("opstop");
    let (a, b) = (unique("opa"), unique("opb"));
    let port_a = env.started(&a, "warm-replicas: 0\n", "1:active");
    env.started(&b, "warm-replicas: 0\n", "1:active");
    let mut names: Vec<String> = env.ok(&["list"]).lines().map(str::to_string).collect();
    names.sort();
    let mut want = vec![a.clone(), b.clone()];
    want.sort();
    assert_eq!(names, want, "list: one name a line");

    let r = env.pid_of(&a, 1);
    let out = env.ok(&["stop", &a]);
    assert!(out.contains("stays held"), "{out}");
    // Once stop has returned, the load balancer answers for the app: the
    // very next request gets the stopped page, not the copy.
    let page = get(port_a, "/", &[]).unwrap();
    assert_eq!(page.status, 503, "the first request after stop returned: {page:?}");
    wait_gone(r, Duration::from_secs(15), "the copy to stop");
    let page = get(port_a, "/", &[]).unwrap();
    assert_eq!(page.status, 503, "{page:?}");
    assert_eq!(page.header("retry-after"), Some("60"));
    assert!(page.body.contains(&format!("{a} is stopped")), "{}", page.body);
    holds_for(Duration::from_secs(2), "no request wakes a stopped app", || env.copies(&a).iter().all(|c| c.pid.is_none()));
    let status = env.status();
    let app = status["apps"].as_array().unwrap().iter().find(|x| x["name"] == a.as_str()).unwrap().clone();
    assert_eq!(app["state"], "stopped", "{app}");
    assert!(env.ok(&["status", &a]).contains("stopped for"), "status says so");

    env.ok(&["start", &a]);
    env.wait_roles(&a, "2:active", Duration::from_secs(60));
    assert_eq!(wait_http_ok(port_a, Duration::from_secs(10)).status, 200);

    let out = env.ok(&["scale", &a, "2"]);
    assert!(out.contains("replicas 1 -> 2"), "{out}");
    wait_until(Duration::from_secs(60), "two active copies", || {
        (env.copies(&a).iter().filter(|c| c.role == "active").count() == 2).then_some(())
    });
    assert!(!env.run(&["scale", &a, "0"]).status.success(), "0 replicas is refused");

    let out = env.ok(&["restart", "--all", "--wait=90s"]);
    assert_eq!(out.matches(" serves (").count(), 2, "each app restarted and serves: {out}");

    // shutdown: the daemon alone stops; the load balancer and copies run on.
    let before = env.status();
    let proxy = before["proxy_pid"].as_u64().unwrap() as u32;
    let daemon = before["daemon_pid"].as_u64().unwrap() as u32;
    let active = |app: &str| env.copies(app).into_iter().find(|c| c.role == "active" && c.pid.is_some()).expect("an active copy");
    let r = active(&b).pid.unwrap();
    let out = env.ok(&["shutdown"]);
    assert!(out.contains("Stopped."), "{out}");
    wait_gone(daemon, Duration::from_secs(10), "the daemon to end");
    assert!(pid_alive(proxy) && pid_alive(r), "the load balancer and the copies run on");
    assert_eq!(wait_http_ok(port_a, Duration::from_secs(10)).status, 200, "visitors are still served");

    // A new daemon adopts them; shutdown --all ends everything.
    env.ok(&["serve", "-d"]);
    let adopted = wait_until(Duration::from_secs(30), "the new daemon's roles", || {
        env.copies(&b).into_iter().find(|c| c.role == "active" && c.pid.is_some()).and_then(|c| c.pid)
    });
    assert_eq!(adopted, r, "adopted, same PID");
    let daemon = env.status()["daemon_pid"].as_u64().unwrap() as u32;
    env.ok(&["shutdown", "--all"]);
    for (pid, what) in [(daemon, "the daemon"), (proxy, "the load balancer"), (r, "a copy")] {
        wait_gone(pid, Duration::from_secs(20), what);
    }
    assert!(get(port_a, "/", &[]).is_err(), "nothing listens once everything stopped");
}

/// `delete --now` and at once `shutdown --all` (before the daemon's cycle
/// saw the copies end): the app's copies' disks (unmounted first, under a
/// root daemon), its state file and its releases go all the same; the next
/// daemon, which does not know the app, would never remove them.
#[test]
fn a_delete_cut_short_by_shutdown_all_leaves_nothing_of_the_app() {
    let env = Env::new("opdelshut");
    let app = unique("delshut");
    env.started(&app, "warm-replicas: 1\n", "1:active 2:warm");
    let state = env.dir.join("apps").join(&app).join("state.json");
    assert!(state.exists(), "the app's state file beside its manifest");
    let scratch = env.home().join(format!("scratch/default-{app}"));
    assert!(scratch.join("1").exists(), "copy 1's disk");
    let r = env.pid_of(&app, 1);
    env.ok(&["delete", &app, "--now"]);
    env.ok(&["shutdown", "--all"]);
    wait_gone(r, Duration::from_secs(20), "the copy to stop");
    let left: Vec<_> = std::fs::read_dir(&scratch).map(|d| d.flatten().map(|e| e.file_name()).collect()).unwrap_or_default();
    assert!(left.is_empty(), "nothing of the app's copies' disks is left: {left:?}");
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    assert!(!mounts.contains(scratch.to_str().unwrap()), "no disk of the app stays mounted: {mounts}");
    assert!(!state.exists(), "its state file went");
    assert!(!env.home().join(format!("releases/default/{app}")).exists(), "its releases went");
}

/// A delete that drains (a session open on the app's copy) cut short by a
/// plain `shutdown`: the copy runs on, draining, and the next daemon
/// finishes the delete once the session ends (the copy stopped, its disk,
/// the state file and the releases removed), where it used to know nothing
/// of the app and leave its disk and state file for good.
#[test]
fn a_delete_cut_short_by_shutdown_is_finished_by_the_next_daemon() {
    let env = Env::new("opdelnext");
    let app = unique("delnext");
    let port = env.started(&app, "warm-replicas: 0\n", "1:active");
    let state = env.dir.join("apps").join(&app).join("state.json");
    let scratch = env.home().join(format!("scratch/default-{app}"));
    let r = env.pid_of(&app, 1);
    let session = Session::open(port, "");
    let out = env.ok(&["delete", &app]);
    assert!(out.contains("stops once its sessions end"), "{out}");
    let daemon = env.status()["daemon_pid"].as_u64().unwrap() as u32;
    env.ok(&["shutdown"]);
    wait_gone(daemon, Duration::from_secs(10), "the daemon to end");
    assert!(pid_alive(r), "the draining copy runs on while its session is open");
    assert!(scratch.join("1").exists() && state.exists(), "the delete is not finished yet");

    env.ok(&["serve", "-d"]);
    wait_until(Duration::from_secs(30), "the new daemon to adopt the draining copy of the app being deleted", || {
        let app_state = env.status()["apps"].as_array()?.iter().find(|a| a["name"] == app.as_str())?["state"].clone();
        let copy = env.copies(&app).into_iter().find(|c| c.copy == 1)?;
        (app_state == "being-deleted" && copy.pid == Some(r) && copy.role == "draining").then_some(())
    });
    holds_for(Duration::from_secs(2), "the new daemon keeps the copy draining while its session is open", || pid_alive(r));
    session.close();
    wait_gone(r, Duration::from_secs(30), "the copy to stop once its session ended");
    // The daemon removes the disk and the state file, then saves
    // registry.json without the app, in one cycle: waited for as a whole,
    // since a look between two of the steps sees the delete half done.
    let registry = env.home().join("registry.json");
    wait_until(Duration::from_secs(30), "the delete finished: the app's disk, state file and registry.json entry gone", || {
        let left = std::fs::read_dir(&scratch).map(|d| d.flatten().count()).unwrap_or(0);
        let registered = std::fs::read_to_string(&registry).ok().is_none_or(|r| r.contains(&app));
        (left == 0 && !state.exists() && !registered).then_some(())
    });
    assert!(!std::fs::read_to_string("/proc/mounts").unwrap().contains(scratch.to_str().unwrap()), "no disk of the app stays mounted");
    assert!(!env.home().join(format!("releases/default/{app}")).exists(), "its releases went");
    assert!(!env.ok(&["list"]).contains(&app), "no longer listed");
}

/// v1, v2, a broken edit (refused: v2 keeps serving), v3, then rollback:
/// it goes to v2, the last release that served, never to the broken one;
/// `releases` lists the broken one as failed, and `rollback --to` goes to
/// any kept release.
#[test]
fn rollback_never_goes_to_a_release_that_never_served_and_releases_lists_them() {
    let env = Env::new("oprelease");
    let app = unique("oprel");
    let port = free_port();
    let manifest = env.app_running(&versioned("v1"), &app, port, "warm-replicas: 0\nkeep-releases: 4\n");
    env.ok(&["apply", "-f", manifest.to_str().unwrap(), "--wait=60s"]);
    let app_r = manifest.with_file_name("app.R");
    std::fs::write(&app_r, versioned("v2")).unwrap();
    env.ok(&["restart", &app, "--wait=60s"]);
    std::fs::write(&app_r, format!("{}stop(\"broken edit\")\n", versioned("v2b"))).unwrap();
    assert!(!env.run(&["restart", &app, "--wait=60s"]).status.success(), "the broken edit fails");
    assert_eq!(version_served(port), "v2", "v2 kept serving");
    let listed = wait_until(Duration::from_secs(20), "the failed deploy listed failed", || {
        let listed = env.ok(&["releases", &app]);
        listed.contains("current, failed (never ready; the release before serves)").then_some(listed)
    });
    assert!(!listed.contains("starting (not ready yet)"), "{listed}");
    std::fs::write(&app_r, versioned("v3")).unwrap();
    env.ok(&["restart", &app, "--now", "--wait=60s"]);
    assert_eq!(version_served(port), "v3");

    let listed = env.ok(&["releases", &app]);
    let lines: Vec<&str> = listed.lines().skip(1).collect();
    assert_eq!(lines.len(), 4, "{listed}");
    assert!(lines[0].contains("served") && lines[1].contains("served"), "{listed}");
    assert!(lines[2].contains("failed (never ready; no rollback target)"), "the broken release: {listed}");
    assert!(lines[3].contains("current, served"), "{listed}");
    let id = |line: &str| line.split_whitespace().next().unwrap().to_string();

    let out = env.ok(&["rollback", &app, "--wait=60s"]);
    assert!(out.contains(&format!("rolling back to release {}", id(lines[1]))), "to v2's release: {out}");
    assert_eq!(version_served(port), "v2", "the last release that served");
    let status = env.ok(&["status", &app]);
    assert!(status.contains(&format!("runs the rolled-back release {}", id(lines[1]))), "{status}");

    // A reload (the unit's ExecReload) leaves a rolled-back app whose
    // manifest is unchanged as it is.
    let out = env.ok(&["reload"]);
    assert!(out.contains(&format!("{app}: unchanged")), "{out}");
    assert_eq!(version_served(port), "v2", "still the rolled-back release");

    // rollback again goes one further back (past the broken one), not to
    // v3, which was rolled away from.
    let out = env.ok(&["rollback", &app, "--wait=60s"]);
    assert!(out.contains(&format!("rolling back to release {}", id(lines[0]))), "to v1's release: {out}");
    assert_eq!(version_served(port), "v1");
    env.ok(&["rollback", &app, "--to", &id(lines[3]), "--wait=60s"]);
    assert_eq!(version_served(port), "v3", "--to: any kept release, forward too");
}

/// start-timeout applies to a wake too: an app that starts well the first
/// time and hangs when woken gets its held request answered 503 once the
/// wake's copy is stopped at start-timeout, not a 504 after request-timeout.
#[test]
fn a_wake_whose_copy_is_not_ready_within_start_timeout_answers_503() {
    let env = Env::new("opwaketo");
    let app = unique("wakehang");
    let port = free_port();
    // Its disk is kept through sleep: the second start hangs.
    let app_r = second_start("Sys.sleep(3600)");
    let manifest = env.app_running(&app_r, &app, port, "warm-replicas: 0\nidle-timeout: 3s\nstart-timeout: 4s\nrequest-timeout: 30s\n");
    env.ok(&["apply", "-f", manifest.to_str().unwrap(), "--wait=60s"]);
    env.wait_asleep(&app, Duration::from_secs(60));
    let asked = std::time::Instant::now();
    let r = get(port, "/", &[]).unwrap();
    let took = asked.elapsed();
    assert_eq!(r.status, 503, "the wake failed: {r:?}");
    assert!(took < Duration::from_secs(25), "answered at start-timeout, not at request-timeout: {took:?}");
    assert!(env.status_text(Some(&app)).contains("not ready within start-timeout 4s"), "status says why");
    // Asleep again, status still says the last wake failed, and why.
    let text = wait_until(Duration::from_secs(60), "asleep again, the failed wake said", || {
        let t = env.status_text(Some(&app));
        (t.contains("asleep for") && t.contains("its last wake failed")).then_some(t)
    });
    assert!(text.contains("start-timeout"), "{text}");
}

/// A prerendered document (`runtime: shinyrmd`), fenced: rendered into the
/// copy's own disk at start, its page served as it is.
#[test]
fn a_prerendered_r_markdown_document_runs() {
    let env = Env::new("layoutrmdpre");
    let app = unique("rmdpre");
    let port = free_port();
    let doc = "---\ntitle: \"Pre\"\nruntime: shinyrmd\noutput: html_document\n---\n\nThe prerendered-marker paragraph.\n\n```{r, echo=FALSE}\nsliderInput('n', 'N', 1, 10, 5)\ntextOutput('t')\n```\n\n```{r, context=\"server\"}\noutput$t <- renderText(paste('n is', input$n))\n```\n";
    let manifest = layout_app(&env, &app, port, &[("pre.Rmd", doc)]);
    let out = env.ok(&["apply", "-f", manifest.to_str().unwrap(), "--wait=120s"]);
    assert!(out.contains("serves"), "{out}");
    let page = wait_http_ok(port, Duration::from_secs(60)).body;
    assert!(page.contains("The prerendered-marker paragraph."), "the document, prerendered: {page}");
}

#[test]
fn a_deploy_to_a_stopped_app_starts_nothing_and_has_nothing_to_wait_for() {
    let env = Env::new("opstopped");
    let app = unique("opstopped");
    let port = free_port();
    let manifest = env.app_running(&versioned("v1"), &app, port, "warm-replicas: 0\nidle-timeout: 0\n");
    env.ok(&["apply", "-f", manifest.to_str().unwrap(), "--wait=90s"]);
    assert_eq!(version_served(port), "v1");
    env.ok(&["stop", &app]);
    wait_until(Duration::from_secs(30), "every copy stopped", || env.copies(&app).iter().all(|c| c.pid.is_none()).then_some(()));
    let log = std::fs::read_to_string(env.home().join(format!("logs/default-{app}.log"))).unwrap_or_default();
    assert!(log.contains("(stopped by shinyctl stop)"), "the copy's log says why it ended: {log}");

    // restart, apply and rollback of a stopped app: recorded, nothing starts,
    // and --wait returns at once (exit 0) instead of running to its limit.
    let app_r = manifest.with_file_name("app.R");
    std::fs::write(&app_r, versioned("v2")).unwrap();
    let began = std::time::Instant::now();
    let out = env.ok(&["restart", &app, "--wait=60s"]);
    assert!(out.contains("the app is stopped") && out.contains("nothing to wait for"), "{out}");
    std::fs::write(&manifest, format!("app-name: {app}\nport: {port}\nwarm-replicas: 0\nidle-timeout: 0\nenv:\n  EDITED: \"1\"\n"))
        .unwrap();
    let out = env.ok(&["apply", "-f", manifest.to_str().unwrap(), "--wait=60s"]);
    assert!(out.contains("the app is stopped") && out.contains("nothing to wait for"), "{out}");
    assert!(began.elapsed() < Duration::from_secs(30), "no wait ran to its limit: {:?}", began.elapsed());
    holds_for(Duration::from_secs(3), "no copy to start while stopped", || env.copies(&app).iter().all(|c| c.pid.is_none()));

    // start runs the version deployed meanwhile.
    env.ok(&["start", &app]);
    assert_eq!(version_served(port), "v2");
}

#[test]
fn a_delete_said_twice_says_so_and_followed_logs_end_with_the_app() {
    let env = Env::new("opdelete");
    let app = unique("opdelete");
    let port = env.started(&app, "warm-replicas: 0\nidle-timeout: 0\n", "1:active");
    let cookie = get(port, "/", &[]).unwrap().cookie().expect("a sticky cookie");
    let session = Session::open(port, &cookie);
    let mut follow = std::process::Command::new(bin())
        .args(["logs", &app, "-f"])
        .env("SHINYCTL_HOME", env.home())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    env.track(follow.id());

    let out = env.ok(&["delete", &app]);
    assert!(out.contains("stops once its sessions end"), "{out}");
    // Said again while the open session keeps it: not "no app named".
    let out = env.ok(&["delete", &app]);
    assert!(out.contains("already being deleted") && out.contains("--now"), "{out}");
    assert!(follow.try_wait().unwrap().is_none(), "logs -f follows while the app drains");

    env.ok(&["delete", &app, "--now"]);
    let status = wait_until(Duration::from_secs(30), "logs -f to end once the app is gone", || follow.try_wait().unwrap());
    let mut said = String::new();
    std::io::Read::read_to_string(&mut follow.stderr.take().unwrap(), &mut said).unwrap();
    assert!(status.success() && said.contains("is gone"), "{status:?} {said}");
    drop(session);
}

#[test]
fn status_names_r_s_pid_or_none_never_the_launcher_s() {
    let env = Env::new("oppid");
    let app = unique("oppid");
    let port = free_port();
    // A start that takes a while, so status is read while it goes on.
    let app_r = "Sys.sleep(3)\nshiny::shinyApp(shiny::fluidPage('up'), function(input, output) {})\n";
    env.apply(&env.app_running(app_r, &app, port, "warm-replicas: 0\nidle-timeout: 0\npool: false\n"));
    let mut seen = Vec::new();
    wait_until(Duration::from_secs(60), "the copy ready", || {
        let v = env.status();
        let c = v["apps"][0]["copies"][0].clone();
        if let Some(pid) = c["pid"].as_u64() {
            seen.push((pid as u32, c["launcher_pid"].as_u64()));
        }
        c["ready"].as_bool().unwrap_or(false).then_some(())
    });
    assert!(!seen.is_empty());
    for (pid, launcher) in &seen {
        assert!(is_copy_r(*pid) && Some(u64::from(*pid)) != *launcher, "PID {pid} is R's, not the launcher's {launcher:?}");
    }
}

#[test]
fn stop_and_start_after_a_failed_deploy_serve_the_version_that_served() {
    let env = Env::new("opstopfail");
    let app = unique("stopfail");
    let port = free_port();
    let manifest = env.app_running(&versioned("v1"), &app, port, "warm-replicas: 0\nidle-timeout: 0\n");
    env.ok(&["apply", "-f", manifest.to_str().unwrap(), "--wait=90s"]);
    let app_r = manifest.with_file_name("app.R");
    // A message long enough that R puts it on the line after `Error in …`.
    let why = "broken edit: the database at db.example:5432 refused the connection after three tries";
    std::fs::write(&app_r, format!("{}stop(\"{why}\")\n", versioned("v2"))).unwrap();
    let out = env.run(&["restart", &app, "--wait=90s"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && said.contains(why), "--wait quotes the error whole: {said}");
    assert_eq!(version_served(port), "v1");
    env.ok(&["stop", &app]);
    wait_until(Duration::from_secs(30), "the app's copies to stop", || env.copies(&app).iter().all(|c| c.pid.is_none()).then_some(()));
    env.ok(&["start", &app]);
    // Not a 503 "restarting" after 15 s: the version that served comes back.
    assert_eq!(version_served(port), "v1", "a broken deploy stays out of the visitors' way across stop and start");
    let status = env.ok(&["status", &app]);
    assert!(status.contains(why), "the deployed version is still tried, and said: {status}");
}
