//! The faults issue with real R: what a broken or idle app costs the machine.

use std::time::{Duration, Instant};

use crate::helpers::*;

/// An app whose copy 2 dies at every start (copy 1 serves).
const CRASHING_COPY_2: &str = r#"if (Sys.getenv("SHINYCTL_COPY") == "2") stop("copy 2 is broken on purpose")
library(shiny)
shinyApp(fluidPage(textOutput("copy")), function(input, output) output$copy <- renderText(Sys.getenv("SHINYCTL_COPY")))
"#;

#[test]
fn an_idle_app_with_a_crash_looping_copy_goes_to_sleep() {
    let env = Env::new("faults-crashloop-sleep");
    let port = free_port();
    let manifest = env.app("loopnap", port, "idle-timeout: 20s\n");
    std::fs::write(manifest.with_file_name("app.R"), CRASHING_COPY_2).unwrap();
    env.apply(&manifest);

    // Copy 1 serves while copy 2 crash-loops.
    env.wait_roles("loopnap", "1:active", Duration::from_secs(60));
    wait_until(Duration::from_secs(60), "copy 2 to crash more than once", || {
        env.copies("loopnap").iter().any(|c| c.copy == 2 && c.crashes >= 2).then_some(())
    });
    let pid1 = env.pid_of("loopnap", 1);
    let text = env.ok(&["status", "loopnap"]);
    assert!(
        text.contains("loopnap: copy 2 is crash-looping") && text.contains("Its last error: \"Error") && text.contains("copy 2 is broken on purpose"),
        "the line under the table quotes the copy's last error: {text}"
    );

    // No request: idle-timeout after the deploy, the app sleeps although
    // copy 2 keeps restarting.
    wait_until(Duration::from_secs(90), "the app to fall asleep", || {
        let copies = env.copies("loopnap");
        (!copies.is_empty() && copies.iter().all(|c| c.status == "asleep" && c.pid.is_none())).then_some(())
    });
    wait_gone(pid1, Duration::from_secs(15), "copy 1's R process to stop");

    // Asleep, the broken copy is not started again: its log gets no new
    // start for longer than its backoff (at most 8 s after 3 crashes here,
    // 16 s after 4; the check covers 20 s).
    let starts = env.starts("default-loopnap@2.log").len();
    assert!(starts >= 2, "copy 2 was started several times: {starts}");
    let until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < until {
        assert_eq!(env.starts("default-loopnap@2.log").len(), starts, "a sleeping app restarted its broken copy");
        assert!(env.copies("loopnap").iter().all(|c| c.status == "asleep"), "{}", env.ok(&["status"]));
        std::thread::sleep(Duration::from_millis(500));
    }

    // The first request wakes it, and copy 1 serves again.
    let r = get(port, "/", &[]).unwrap();
    assert_eq!(r.status, 200, "woken by a request: {r:?}");
}

#[test]
fn after_the_binary_is_replaced_the_daemon_still_starts_a_load_balancer() {
    let env = Env::new("faults-replaced-binary");
    // "Installed" shinyctl: a copy of the binary under test.
    let bin_dir = env.dir.join("bin");
    std::fs::create_dir_all(&bin_dir).unwrap();
    let installed = bin_dir.join("shinyctl");
    std::fs::copy(bin(), &installed).unwrap();
    let port = free_port();
    let manifest = env.app("swapped", port, "warm-replicas: 0\n");
    let out = env.run_binary(&installed, &["apply", "-f", manifest.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    env.wait_roles("swapped", "1:active", Duration::from_secs(60));
    wait_http_ok(port, Duration::from_secs(10));
    let old_proxy = env.status()["proxy_pid"].as_u64().expect("a load balancer runs") as u32;

    // install.sh renames a new binary over the old one; here, a file that
    // is no shinyctl at all, so only the running binary itself can serve.
    let tmp = bin_dir.join(".shinyctl.new");
    std::fs::write(&tmp, "#!/bin/sh\nexit 99\n").unwrap();
    std::fs::rename(&tmp, &installed).unwrap();

    signal(old_proxy, 9);
    let new_proxy = wait_until(Duration::from_secs(30), "a new load balancer", || {
        let p = env.status()["proxy_pid"].as_u64()? as u32;
        (p != old_proxy && pid_alive(p)).then_some(p)
    });
    assert_eq!(cmdline(new_proxy), format!("{} proxy", installed.display()), "argv[0] is still the installed path");
    assert_eq!(wait_http_ok(port, Duration::from_secs(10)).status, 200);
}

#[test]
fn a_woken_app_with_an_idle_timeout_shorter_than_its_start_answers_what_it_held() {
    // R takes longer than 1 s to load shiny: the held requests must still be
    // answered by the woken copy, not put back to sleep before they reach it.
    let env = Env::new("faults-short-idle");
    let port = free_port();
    env.apply(&env.app("blink", port, "idle-timeout: 1s\nwarm-replicas: 0\n"));
    wait_until(Duration::from_secs(60), "the app to sleep", || {
        let copies = env.copies("blink");
        (!copies.is_empty() && copies.iter().all(|c| c.status == "asleep" && c.pid.is_none())).then_some(())
    });
    for round in 0..2 {
        let clients: Vec<_> = (0..3).map(|_| std::thread::spawn(move || get(port, "/", &[]).map(|r| r.status))).collect();
        for c in clients {
            assert_eq!(c.join().unwrap().unwrap(), 200, "round {round}: every held request is answered by the woken copy");
        }
        wait_until(Duration::from_secs(60), "the app to sleep again", || {
            env.copies("blink").iter().all(|c| c.status == "asleep").then_some(())
        });
    }
}
