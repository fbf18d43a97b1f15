//! Prometheus metrics and health with a real R app: `GET /v1/metrics` on
//! api.sock and on `SHINYCTL_METRICS`'s TCP address, checked against
//! `shinyctl status --json`; `GET /v1/health`.

use std::process::Command;
use std::time::Duration;

use hyper::Method;

use crate::helpers::*;

const START: Duration = Duration::from_secs(60);

/// One request on the test's api.sock: (status, body).
fn api(env: &Env, path: &str) -> (u16, String) {
    let (status, body) =
        shinyctl::wire::uds::request_blocking(&env.home().join("api.sock"), Method::GET, path, None, Duration::from_secs(10))
            .expect("api.sock answers");
    (status.as_u16(), String::from_utf8_lossy(&body).into_owned())
}

/// The value of the series `name` whose labels include every one of `labels`.
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (series, value) = l.rsplit_once(' ')?;
        let (n, rest) = series.split_once('{').unwrap_or((series, ""));
        (n == name && labels.iter().all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")))).then(|| value.parse().ok()).flatten()
    })
}

/// Every copy in status has its series with the same role and ready, and
/// no other copy of the app has any.
fn check_copies_against_status(env: &Env, app: &str, text: &str) {
    let copies = env.copies(app);
    for c in &copies {
        let copy = c.copy.to_string();
        let labels = [("app", app), ("copy", copy.as_str())];
        let role = if c.ready && c.role != "-" { c.role.as_str() } else { "none" };
        assert_eq!(
            sample(text, "shinyctl_copy_role", &[labels[0], labels[1], ("role", role)]),
            Some(1.0),
            "copy {copy} has role {role} as in status:\n{text}"
        );
        assert_eq!(sample(text, "shinyctl_copy_ready", &labels), Some(if c.ready { 1.0 } else { 0.0 }), "ready of copy {copy}:\n{text}");
        if c.pid.is_some() {
            assert!(sample(text, "shinyctl_copy_resident_memory_bytes", &labels).unwrap_or(0.0) > 1e6, "memory of copy {copy}:\n{text}");
        }
    }
    for line in text.lines().filter(|l| l.starts_with("shinyctl_copy_") && l.contains(&format!("app=\"{app}\""))) {
        let copy: u32 = between(line, "copy=\"", "\"").unwrap().parse().unwrap();
        assert!(copies.iter().any(|c| c.copy == copy), "a series of copy {copy}, which status no longer lists: {line}");
    }
}

/// Starts the test's daemon (`serve -d`) with `SHINYCTL_METRICS` on a free
/// port of 127.0.0.1 (it comes from the daemon's environment); returns the port.
fn serve_with_metrics(env: &Env) -> u16 {
    let metrics_port = free_port();
    let out = Command::new(bin())
        .args(["serve", "-d"])
        .env("SHINYCTL_HOME", env.home())
        .env("SHINYCTL_METRICS", format!("127.0.0.1:{metrics_port}"))
        .output()
        .unwrap();
    assert!(out.status.success(), "serve -d: {}", String::from_utf8_lossy(&out.stderr));
    metrics_port
}

#[test]
fn metrics_match_status_on_api_sock_and_on_the_tcp_address_and_health_says_what_is_up() {
    let env = Env::new("metrics");
    let metrics_port = serve_with_metrics(&env);
    let port = free_port();
    let manifest = env.app("metered", port, "");
    env.apply(&manifest);
    env.wait_roles("metered", "1:active 2:warm", START);
    wait_http_ok(port, Duration::from_secs(10));
    assert_eq!(get(port, "/no-such-page", &[]).unwrap().status, 404);

    // A session open on copy 1: the same count in status and in the metrics.
    let session = Session::open(port, "");
    wait_until(Duration::from_secs(10), "status to count the session", || {
        env.copies("metered").iter().any(|c| c.copy == session.copy && c.sessions == 1).then_some(())
    });
    let (code, text) = api(&env, "/v1/metrics");
    assert_eq!(code, 200, "{text}");
    check_copies_against_status(&env, "metered", &text);
    let copy = session.copy.to_string();
    assert_eq!(sample(&text, "shinyctl_copy_sessions", &[("app", "metered"), ("copy", &copy)]), Some(1.0), "{text}");
    assert!(sample(&text, "shinyctl_copy_open_connections", &[("app", "metered"), ("copy", &copy)]).unwrap_or(0.0) >= 1.0, "{text}");
    assert!(sample(&text, "shinyctl_requests_total", &[("app", "metered"), ("class", "2xx")]).unwrap_or(0.0) >= 1.0, "{text}");
    assert!(sample(&text, "shinyctl_requests_total", &[("app", "metered"), ("class", "4xx")]).unwrap_or(0.0) >= 1.0, "the 404:\n{text}");
    assert!(
        sample(&text, "shinyctl_requests_total", &[("app", "metered"), ("class", "1xx")]).unwrap_or(0.0) >= 1.0,
        "the upgrade:\n{text}"
    );
    assert!(sample(&text, "shinyctl_request_duration_seconds_count", &[("app", "metered")]).unwrap_or(0.0) >= 3.0, "{text}");
    assert!(sample(&text, "shinyctl_load_balancer_resident_memory_bytes", &[]).unwrap_or(0.0) > 1e6, "{text}");
    assert!(sample(&text, "shinyctl_load_balancer_open_connections", &[]).unwrap_or(0.0) >= 1.0, "the session:\n{text}");
    assert_eq!(sample(&text, "shinyctl_asleep_seconds", &[("app", "metered")]), Some(0.0), "{text}");
    assert_eq!(sample(&text, "shinyctl_restarts_total", &[("app", "metered"), ("reason", "crash")]), Some(0.0), "{text}");

    // The same scrape on the TCP address, at Prometheus's default path too.
    let tcp = wait_until(Duration::from_secs(10), "the metrics address to answer", || get(metrics_port, "/metrics", &[]).ok());
    assert_eq!(tcp.status, 200, "{}", tcp.body);
    check_copies_against_status(&env, "metered", &tcp.body);
    assert_eq!(sample(&tcp.body, "shinyctl_copy_sessions", &[("app", "metered"), ("copy", &copy)]), Some(1.0), "{}", tcp.body);
    assert_eq!(get(metrics_port, "/v1/status", &[]).unwrap().status, 404, "the TCP address serves metrics and health only");
    session.close();

    // A crash: the warm copy is killed; it comes back and is counted.
    let warm = env.pid_of("metered", 2);
    signal(warm, 9);
    wait_until(START, "a restart by crash counted", || {
        let (_, text) = api(&env, "/v1/metrics");
        (sample(&text, "shinyctl_restarts_total", &[("app", "metered"), ("reason", "crash")]) == Some(1.0)).then_some(())
    });
    env.wait_roles("metered", "1:active 2:warm", START);

    // Scaling: a third copy, counted; then back down, and the copy that
    // goes takes its series with it.
    std::fs::write(&manifest, format!("app-name: metered\nport: {port}\nreplicas: 2\n")).unwrap();
    env.apply(&manifest);
    env.wait_roles("metered", "1:active 2:active 3:warm", START);
    let (_, text) = api(&env, "/v1/metrics");
    assert_eq!(sample(&text, "shinyctl_restarts_total", &[("app", "metered"), ("reason", "scaling")]), Some(1.0), "{text}");
    check_copies_against_status(&env, "metered", &text);
    std::fs::write(&manifest, format!("app-name: metered\nport: {port}\nreplicas: 1\n")).unwrap();
    env.apply(&manifest);
    let gone = wait_until(START, "a copy to be gone", || {
        let left: Vec<u32> = env.copies("metered").iter().map(|c| c.copy).collect();
        (left.len() == 2).then(|| [1, 2, 3].into_iter().find(|c| !left.contains(c)).unwrap())
    });
    let (_, text) = api(&env, "/v1/metrics");
    check_copies_against_status(&env, "metered", &text);
    assert!(!text.contains(&format!("copy=\"{gone}\"")), "copy {gone} is gone and so are its series:\n{text}");

    // Health: up, and down (503) while the load balancer does not answer.
    let (code, body) = api(&env, "/v1/health");
    assert_eq!(code, 200, "{body}");
    let health: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!((health["daemon"].as_bool(), health["load_balancer"].as_bool()), (Some(true), Some(true)), "{body}");
    let proxy = env.status()["proxy_pid"].as_u64().expect("a load balancer") as u32;
    assert_eq!(health["load_balancer_pid"].as_u64(), Some(proxy as u64), "{body}");
    assert_eq!(get(metrics_port, "/v1/health", &[]).unwrap().status, 200);
    signal(proxy, libc::SIGSTOP);
    let stopped = api(&env, "/v1/health");
    let scraped = api(&env, "/v1/metrics");
    signal(proxy, libc::SIGCONT);
    assert_eq!(stopped.0, 503, "the load balancer does not answer: {}", stopped.1);
    assert!(stopped.1.contains("\"load_balancer\":false"), "{}", stopped.1);
    assert_eq!(sample(&scraped.1, "shinyctl_load_balancer_up", &[]), Some(0.0), "{}", scraped.1);
    wait_until(Duration::from_secs(10), "health to be up again", || (api(&env, "/v1/health").0 == 200).then_some(()));
}

#[test]
fn a_bad_metrics_address_is_a_line_in_api_log_and_the_daemon_runs_on() {
    let env = Env::new("metrics-bad");
    let out = Command::new(bin())
        .args(["serve", "-d"])
        .env("SHINYCTL_HOME", env.home())
        .env("SHINYCTL_METRICS", "not-an-address")
        .output()
        .unwrap();
    assert!(out.status.success(), "serve -d: {}", String::from_utf8_lossy(&out.stderr));
    env.status();
    let log = wait_until(Duration::from_secs(10), "the line in api.log", || {
        std::fs::read_to_string(env.home().join("api.log")).ok().filter(|l| l.contains("SHINYCTL_METRICS"))
    });
    assert!(log.contains("is not an ADDR:PORT"), "{log}");
    assert_eq!(api(&env, "/v1/metrics").0, 200, "metrics are still on api.sock");
}

#[test]
fn time_asleep_a_wake_and_a_redeploy_are_in_the_metrics() {
    let env = Env::new("metrics-wake");
    let port = free_port();
    // Well above an R start on a loaded machine (see sleep.rs).
    let settings = "warm-replicas: 0\nidle-timeout: 20s\n";
    let manifest = env.app("napper", port, settings);
    env.apply(&manifest);
    env.wait_roles("napper", "1:active", START);
    let first = env.pid_of("napper", 1);
    env.wait_asleep("napper", START);
    wait_gone(first, Duration::from_secs(30), "the copy put to sleep");
    let metric = |name: &str, labels: &[(&str, &str)]| sample(&api(&env, "/v1/metrics").1, name, labels);
    let app = [("app", "napper")];
    wait_until(Duration::from_secs(10), "time asleep to count", || {
        (metric("shinyctl_asleep_seconds", &app).unwrap_or(0.0) > 0.0).then_some(())
    });
    assert_eq!(metric("shinyctl_wakes_total", &app), Some(0.0));

    // The first request wakes it: one wake, timed; a wake is no restart.
    assert_eq!(get(port, "/", &[]).unwrap().status, 200);
    // The daemon books the wake's end in the loop turn after the push that
    // let the request through, a moment after the answer.
    let text = wait_until(Duration::from_secs(10), "the wake's end in the metrics", || {
        let (_, text) = api(&env, "/v1/metrics");
        sample(&text, "shinyctl_wake_duration_seconds_count", &app).is_some_and(|n| n > 0.0).then_some(text)
    });
    assert_eq!(sample(&text, "shinyctl_wakes_total", &app), Some(1.0), "{text}");
    assert_eq!(sample(&text, "shinyctl_wake_duration_seconds_count", &app), Some(1.0), "{text}");
    assert!(sample(&text, "shinyctl_wake_duration_seconds_sum", &app).unwrap_or(0.0) > 0.0, "an R start takes time:\n{text}");
    assert_eq!(sample(&text, "shinyctl_asleep_seconds", &app), Some(0.0), "{text}");
    for reason in ["crash", "redeploy", "scaling"] {
        assert_eq!(sample(&text, "shinyctl_restarts_total", &[app[0], ("reason", reason)]), Some(0.0), "{reason}:\n{text}");
    }

    // A change of env redeploys: counted as such.
    std::fs::write(&manifest, format!("app-name: napper\nport: {port}\n{settings}env:\n  COLOUR: blue\n")).unwrap();
    env.apply(&manifest);
    env.wait_roles("napper", "2:active", START);
    let (_, text) = api(&env, "/v1/metrics");
    assert_eq!(sample(&text, "shinyctl_restarts_total", &[app[0], ("reason", "redeploy")]), Some(1.0), "{text}");
}

/// The app of the operator's series: the usual page and session, `/burn`
/// (eight seconds of busy R) and `POST /post` (the copy kills itself, so
/// the load balancer answers 502: a POST is never sent again).
const METERED_R: &str = r#"
library(shiny)
shiny:::handlerManager$addHandler(function(req) {
  path <- req$PATH_INFO
  if (identical(path, "/burn")) {
    t0 <- proc.time()[["elapsed"]]
    while (proc.time()[["elapsed"]] - t0 < 8) NULL
    return(httpResponse(200, "text/plain", "burnt\n"))
  }
  if (identical(path, "/post")) tools::pskill(Sys.getpid(), tools::SIGKILL)
  NULL
}, "metrics-test")
ui <- fluidPage(tags$p(paste0("copy=", Sys.getenv("SHINYCTL_COPY"), ";")), textOutput("live"))
server <- function(input, output, session) {
  output$live <- renderText(paste0("live-from-copy-", Sys.getenv("SHINYCTL_COPY")))
}
shinyApp(ui, server)
"#;

/// Copy `copy` of `app` in `status --json`.
fn copy_json(env: &Env, app: &str, copy: u64) -> serde_json::Value {
    let status = env.status();
    let apps = status["apps"].as_array().cloned().unwrap_or_default();
    let a = apps.into_iter().find(|a| a["name"] == app).expect("the app in status");
    a["copies"].as_array().and_then(|c| c.iter().find(|c| c["copy"] == copy).cloned()).expect("the copy in status")
}

/// The cells of the `status` table's line `n` (0: the header).
fn table_cells(text: &str, n: usize) -> Vec<String> {
    text.lines().nth(n).unwrap_or_default().split_whitespace().map(str::to_string).collect()
}

#[test]
fn cpu_uptime_and_an_operators_series_come_from_a_real_app() {
    let env = Env::new("metrics-ops");
    let metrics_port = serve_with_metrics(&env);
    let port = free_port();
    let applied_ms = now_ms();
    let extra = "warm-replicas: 0\nsandbox:\n  memory: 400M\n";
    env.apply(&env.app_running(METERED_R, "ops", port, extra));
    env.wait_roles("ops", "1:active", START);
    wait_http_ok(port, Duration::from_secs(10));
    let metric = |name: &str, labels: &[(&str, &str)]| sample(&api(&env, "/v1/metrics").1, name, labels);
    let copy1 = [("app", "ops"), ("copy", "1")];

    // status --json: CPU time (R loading shiny takes some), uptime, start
    // time and the memory limit of each copy.
    let c = copy_json(&env, "ops", 1);
    let cpu_before = c["cpu_secs"].as_f64().expect("cpu_secs");
    assert!(cpu_before > 0.2, "R loading shiny uses CPU: {c}");
    let started_ms = c["started_ms"].as_u64().expect("started_ms");
    assert!((applied_ms..=now_ms()).contains(&started_ms), "started after the apply: {c}");
    assert!(c["uptime_secs"].as_u64().expect("uptime_secs") <= (now_ms() - applied_ms) / 1000 + 1, "{c}");
    assert_eq!(c["memory_limit_bytes"].as_u64(), Some(400 << 20), "{c}");

    // The default table keeps the documented columns; --wide adds four.
    let documented = ["NAME", "COPY", "ROLE", "PORT", "PID", "STATUS", "READY", "MEM", "SESSIONS", "CRASHES", "STARTED"];
    assert_eq!(table_cells(&env.ok(&["status"]), 0), documented);
    let wide = env.ok(&["status", "--wide"]);
    let (header, row) = (table_cells(&wide, 0), table_cells(&wide, 1));
    assert_eq!(header[..11], documented, "{wide}");
    assert_eq!(header[11..], ["UPTIME", "CPU", "CPU-TIME", "MEM-LIMIT"], "{wide}");
    assert_eq!((row[0].as_str(), row[14].as_str()), ("ops", "400M"), "{wide}");
    assert!(row[11].ends_with('s') && row[13].contains(':'), "uptime and CPU time: {wide}");

    // Eight seconds of busy R: the sampler's percent shows it while it
    // runs, and the CPU seconds grow.
    let burn = std::thread::spawn(move || get(port, "/burn", &[]).map(|r| r.status));
    let busy = wait_until(Duration::from_secs(30), "a CPU percent above 10", || {
        copy_json(&env, "ops", 1)["cpu_percent"].as_f64().filter(|p| *p >= 10.0)
    });
    assert_eq!(burn.join().unwrap().unwrap(), 200);
    let cpu_after = metric("shinyctl_copy_cpu_seconds_total", &copy1).expect("CPU seconds");
    assert!(cpu_after >= cpu_before + 0.5, "{cpu_before} s then {cpu_after} s of CPU, at {busy}%");
    assert!(env.ok(&["status", "--wide"]).lines().nth(1).unwrap().contains('%'), "the CPU column shows a percent");

    // What an operator graphs, against status.
    let text = api(&env, "/v1/metrics").1;
    let build = text.lines().find(|l| l.starts_with("shinyctl_build_info{")).expect("build info");
    assert!(build.contains(&format!("version=\"{}\"", env!("CARGO_PKG_VERSION"))) && build.ends_with(" 1"), "{build}");
    assert_eq!(sample(&text, "shinyctl_app_desired_replicas", &[("app", "ops")]), Some(1.0), "{text}");
    assert_eq!(sample(&text, "shinyctl_app_state", &[("app", "ops"), ("state", "running")]), Some(1.0), "{text}");
    assert_eq!(sample(&text, "shinyctl_copy_memory_limit_bytes", &copy1), Some((400u64 << 20) as f64), "{text}");
    assert_eq!(sample(&text, "shinyctl_copy_start_time_seconds", &copy1), Some(started_ms as f64 / 1000.0), "{text}");
    assert_eq!(sample(&text, "shinyctl_copy_state", &[copy1[0], copy1[1], ("state", "alive")]), Some(1.0), "{text}");
    assert_eq!(sample(&text, "shinyctl_copy_crashes", &copy1), Some(0.0), "{text}");

    // A session opened, and the bytes of a page.
    let session = Session::open(port, "");
    session.close();
    let app = [("app", "ops")];
    wait_until(Duration::from_secs(10), "the session counted", || {
        (metric("shinyctl_sessions_opened_total", &app) == Some(1.0)).then_some(())
    });
    let (sent, received) = (metric("shinyctl_sent_bytes_total", &app).unwrap(), metric("shinyctl_received_bytes_total", &app).unwrap());
    let page = get(port, "/", &[]).unwrap();
    assert_eq!(page.status, 200);
    wait_until(Duration::from_secs(10), "the page's bytes counted", || {
        let more_out = metric("shinyctl_sent_bytes_total", &app).unwrap() >= sent + page.body.len() as f64;
        let more_in = metric("shinyctl_received_bytes_total", &app).unwrap() >= received + "GET / HTTP/1.1\r\n".len() as f64;
        (more_out && more_in).then_some(())
    });

    // 503 while stopped, 502 for a POST whose copy died: counted apart.
    env.ok(&["stop", "ops"]);
    // The stop reaches the load balancer a moment later; the first 503 ends the wait.
    wait_until(Duration::from_secs(30), "the stopped page", || (get(port, "/", &[]).unwrap().status == 503).then_some(()));
    let text = api(&env, "/v1/metrics").1;
    assert_eq!(sample(&text, "shinyctl_gateway_errors_total", &[app[0], ("code", "503")]), Some(1.0), "{text}");
    assert_eq!(sample(&text, "shinyctl_app_state", &[app[0], ("state", "stopped")]), Some(1.0), "{text}");
    env.ok(&["start", "ops"]);
    // A start starts a new copy: copy numbers are never reused.
    env.wait_roles("ops", "2:active", START);
    let copy = [("app", "ops"), ("copy", "2")];
    wait_http_ok(port, Duration::from_secs(10));
    assert_eq!(http(port, "POST", "/post", &[("Content-Length", "0")]).unwrap().status, 502);
    env.wait_roles("ops", "2:active", START);
    let text = wait_until(START, "the crash counted", || {
        let text = api(&env, "/v1/metrics").1;
        (sample(&text, "shinyctl_restarts_total", &[app[0], ("reason", "crash")]) == Some(1.0)).then_some(text)
    });
    assert_eq!(sample(&text, "shinyctl_gateway_errors_total", &[app[0], ("code", "502")]), Some(1.0), "{text}");
    assert_eq!(sample(&text, "shinyctl_gateway_errors_total", &[app[0], ("code", "504")]), Some(0.0), "{text}");
    assert_eq!(sample(&text, "shinyctl_restarts_total", &[app[0], ("reason", "scaling")]), Some(0.0), "stop, start: no scaling\n{text}");
    let crashes = env.copies("ops")[0].crashes as f64;
    assert_eq!(sample(&text, "shinyctl_copy_crashes", &copy), Some(crashes), "as status says:\n{text}");
    assert!(crashes >= 1.0, "{text}");

    // The classic text format, for a scraper that asks for it.
    let classic = get(metrics_port, "/metrics", &[("Accept", "text/plain;version=0.0.4")]).unwrap();
    assert_eq!(classic.header("content-type"), Some("text/plain; version=0.0.4; charset=utf-8"), "{classic:?}");
    assert!(!classic.body.contains("# EOF") && !classic.body.contains("# UNIT"), "{}", classic.body);
    assert!(classic.body.contains("\n# TYPE shinyctl_restarts_total counter\n"), "{}", classic.body);
    assert_eq!(sample(&classic.body, "shinyctl_restarts_total", &[app[0], ("reason", "crash")]), Some(1.0), "{}", classic.body);
    let open = get(metrics_port, "/metrics", &[]).unwrap();
    assert!(open.header("content-type").is_some_and(|t| t.starts_with("application/openmetrics-text")), "{open:?}");
    assert!(open.body.ends_with("# EOF\n"), "{}", open.body);

    // The load balancer killed: started again, and counted.
    let proxy = env.status()["proxy_pid"].as_u64().expect("a load balancer") as u32;
    assert_eq!(metric("shinyctl_load_balancer_restarts_total", &[]), Some(0.0));
    signal(proxy, 9);
    wait_until(Duration::from_secs(30), "the load balancer started again and counted", || {
        let text = api(&env, "/v1/metrics").1;
        let again = sample(&text, "shinyctl_load_balancer_restarts_total", &[]) == Some(1.0);
        (again && sample(&text, "shinyctl_load_balancer_up", &[]) == Some(1.0)).then_some(())
    });
    wait_http_ok(port, Duration::from_secs(10));
}

/// An app that starts once: started again (a wake: its own disk is kept
/// through a sleep), it stops with an error when `ON_WAKE` is `fail`, else
/// never gets ready.
const WAKES_BADLY_R: &str = r#"
library(shiny)
marker <- file.path(Sys.getenv("SHINYCTL_SCRATCH"), "started-before")
if (file.exists(marker)) {
  if (Sys.getenv("ON_WAKE") == "fail") stop("this copy fails on waking")
  Sys.sleep(600)
}
writeLines("x", marker)
shinyApp(fluidPage("awake"), function(input, output, session) {})
"#;

#[test]
fn a_failed_wake_and_one_that_takes_too_long_are_counted_apart() {
    let env = Env::new("metrics-badwake");
    // (app, its request-timeout, ON_WAKE, the answer to the waking
    // request). The failing one has all the time R may take on a loaded
    // machine to load shiny and fail.
    for (name, timeout, on_wake, status) in [("fails", "30s", "fail", 503), ("slow", "3s", "hang", 504)] {
        let port = free_port();
        let extra = format!("idle-timeout: 20s\nwarm-replicas: 0\nrequest-timeout: {timeout}\nenv:\n  ON_WAKE: {on_wake}\n");
        env.apply(&env.app_running(WAKES_BADLY_R, name, port, &extra));
        env.wait_roles(name, "1:active", START);
        wait_http_ok(port, Duration::from_secs(10));
        let pid = env.pid_of(name, 1);
        wait_until(START, "the app to sleep", || env.copies(name).iter().all(|c| c.status == "asleep" && c.pid.is_none()).then_some(()));
        wait_gone(pid, Duration::from_secs(30), "the copy put to sleep");
        assert_eq!(get(port, "/", &[]).unwrap().status, status, "{name}");
        let app = [("app", name)];
        let code = status.to_string();
        let text = wait_until(Duration::from_secs(10), "the answer counted", || {
            let text = api(&env, "/v1/metrics").1;
            (sample(&text, "shinyctl_gateway_errors_total", &[app[0], ("code", &code)]) == Some(1.0)).then_some(text)
        });
        assert_eq!(sample(&text, "shinyctl_wakes_total", &app), Some(1.0), "{text}");
        // Only the wake whose copies all ended failed; the slow one is
        // still going when the load balancer gives up on the request.
        let failed = if status == 503 { 1.0 } else { 0.0 };
        assert_eq!(sample(&text, "shinyctl_wake_failures_total", &app), Some(failed), "{name}:\n{text}");
    }
}
