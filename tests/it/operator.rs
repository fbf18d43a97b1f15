//! An operator's day with real R, as a person types it: deploys that tell
//! the truth (`--wait`), a broken edit deployed to a sleeping app that never
//! reaches a visitor.

use std::time::Duration;

use crate::helpers::*;

/// An app whose page says which version it is.
fn versioned(version: &str) -> String {
    format!("library(shiny)\nshinyApp(fluidPage(tags$p(\"version={version};\")), function(input, output) {{}})\n")
}

/// Waits until every copy of the app is asleep with no process.
fn wait_asleep(env: &Env, app: &str) {
    wait_until(Duration::from_secs(90), "the app to sleep", || {
        let copies = env.copies(app);
        (!copies.is_empty() && copies.iter().all(|c| c.status == "asleep" && c.pid.is_none())).then_some(())
    });
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
    wait_asleep(&env, &app);

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

    // The next visitor wakes the version before.
    assert_eq!(version_served(port), "v1", "a broken edit never reaches a visitor");

    // The fix, deployed the same way, serves.
    std::fs::write(&app_r, versioned("v2")).unwrap();
    let out = env.ok(&["restart", &app, "--wait=90s"]);
    assert!(out.contains(" serves (1 active)"), "{out}");
    assert_eq!(version_served(port), "v2");

    // Asleep again, a good edit is checked by one copy and the app sleeps on it.
    wait_asleep(&env, &app);
    std::fs::write(&app_r, versioned("v3")).unwrap();
    let out = env.ok(&["restart", &app, "--wait=90s"]);
    assert!(out.contains("the app sleeps on it"), "{out}");
    assert!(env.copies(&app).iter().all(|c| c.status == "asleep"), "asleep after the check");
    assert_eq!(version_served(port), "v3", "it wakes with the checked version");

    // An apply that changes nothing has nothing to wait for.
    let out = env.ok(&["apply", "-f", manifest.to_str().unwrap(), "--wait"]);
    assert!(out.contains("nothing to wait for"), "{out}");
}
