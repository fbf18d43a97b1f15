//! systemd, without systemd: the readiness notification to a socket of the
//! test's own, `shinyctl reload` (the unit's `ExecReload=`), and
//! `install.sh --service` against recording stand-ins for systemctl and
//! loginctl.

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::helpers::*;

const START: Duration = Duration::from_secs(60);

/// Reads one datagram within `timeout`.
fn recv(sock: &UnixDatagram, timeout: Duration) -> Option<String> {
    sock.set_read_timeout(Some(timeout)).unwrap();
    let mut buf = [0u8; 256];
    let n = sock.recv(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

#[test]
fn serve_says_ready_on_notify_socket_once_status_answers_and_hides_it_from_children() {
    let env = Env::new("notify");
    let path = env.dir.join("notify.sock");
    let sock = UnixDatagram::bind(&path).unwrap();
    // As systemd runs it: `shinyctl serve` in the foreground.
    let mut daemon = Command::new(bin())
        .arg("serve")
        .env("SHINYCTL_HOME", env.home())
        .env("NOTIFY_SOCKET", &path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    env.track(daemon.id());
    let ready = recv(&sock, Duration::from_secs(20));
    // The very next status must answer: no retry.
    let status = Command::new(bin()).arg("status").env("SHINYCTL_HOME", env.home()).output().unwrap();
    assert_eq!(ready.as_deref(), Some("READY=1"), "the daemon said it is ready");
    assert!(status.status.success(), "status answers once READY=1 is sent: {}", String::from_utf8_lossy(&status.stderr));
    let v = env.status();
    assert_eq!(v["daemon_pid"].as_u64(), Some(daemon.id() as u64));

    // The load balancer it started does not inherit NOTIFY_SOCKET.
    let proxy = wait_until(Duration::from_secs(20), "the load balancer", || env.status()["proxy_pid"].as_u64()) as u32;
    let environ = std::fs::read(format!("/proc/{proxy}/environ")).unwrap();
    let environ = String::from_utf8_lossy(&environ);
    assert!(environ.contains("SHINYCTL_HOME="), "read the load balancer's environment: {environ}");
    assert!(!environ.contains("NOTIFY_SOCKET"), "the load balancer does not inherit NOTIFY_SOCKET: {environ}");

    signal(daemon.id(), libc::SIGTERM);
    assert_eq!(recv(&sock, Duration::from_secs(10)).as_deref(), Some("STOPPING=1"));
    let exited = daemon.wait().unwrap();
    assert!(exited.success(), "serve ends cleanly on SIGTERM: {exited}");
}

/// The `GREETING` line of a manifest's env, for the reload test's edit.
fn manifest(name: &str, port: u16, greeting: &str) -> String {
    format!("app-name: {name}\nport: {port}\nwarm-replicas: 0\nenv:\n  GREETING: {greeting}\n")
}

#[test]
fn reload_applies_every_manifest_again_and_leaves_an_app_with_a_bad_one_as_it_is() {
    let env = Env::new("reload");
    let (edited_port, broken_port) = (free_port(), free_port());
    let edited = env.app("edited", edited_port, "");
    let broken = env.app("broken", broken_port, "");
    std::fs::write(&edited, manifest("edited", edited_port, "hello")).unwrap();
    std::fs::write(&broken, manifest("broken", broken_port, "hello")).unwrap();
    env.apply(&edited);
    env.apply(&broken);
    env.wait_roles("edited", "1:active", START);
    env.wait_roles("broken", "1:active", START);
    let broken_pid = env.pid_of("broken", 1);
    let revision = |app: &str| {
        env.status()["apps"].as_array().unwrap().iter().find(|a| a["name"] == app).map(|a| a["revision"].as_u64().unwrap()).unwrap()
    };
    let (edited_rev, broken_rev) = (revision("edited"), revision("broken"));

    let all_fine = env.run(&["reload"]);
    assert!(all_fine.status.success(), "{}", String::from_utf8_lossy(&all_fine.stderr));
    let said = String::from_utf8_lossy(&all_fine.stdout);
    assert!(said.contains("edited: unchanged.") && said.contains("broken: unchanged."), "{said}");

    std::fs::write(&edited, manifest("edited", edited_port, "bonjour")).unwrap();
    std::fs::write(&broken, "app-name: broken\nport: not-a-port\n").unwrap();
    let out = env.run(&["reload"]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success(), "one manifest could not be applied: the exit status says so\n{stdout}\n{stderr}");
    assert!(stdout.contains("edited: changed how it starts"), "{stdout}");
    assert!(stderr.contains("broken: not reloaded from") && stderr.contains(&broken.display().to_string()), "{stderr}");
    assert!(stderr.contains("port"), "why: the bad key: {stderr}");
    assert!(stderr.contains("1 of 2 manifests could not be applied"), "{stderr}");

    // The edited app redeploys with its new env; the other runs on as it was.
    env.wait_roles("edited", "2:active", START);
    assert_eq!(revision("edited"), edited_rev + 1);
    assert_eq!(revision("broken"), broken_rev);
    assert_eq!(env.pid_of("broken", 1), broken_pid, "the app with the bad manifest keeps its copy");
    assert_eq!(get(broken_port, "/", &[]).unwrap().status, 200);

    // A manifest that is gone is reported the same way.
    std::fs::remove_file(&broken).unwrap();
    let out = env.run(&["reload"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("cannot read") && stderr.contains(&broken.display().to_string()), "{stderr}");
    assert_eq!(env.pid_of("broken", 1), broken_pid);
}

/// A folder of stand-ins that record their arguments to `calls.log`.
fn recorders(dir: &Path, names: &[&str]) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let bin = dir.join("fake-bin");
    std::fs::create_dir_all(&bin).unwrap();
    let log = dir.join("calls.log");
    for name in names {
        // `is-active` answers "inactive" (3), as for a service not started yet.
        let body = format!("#!/bin/sh\necho \"{name} $*\" >>'{}'\ncase \"$*\" in *is-active*) exit 3 ;; esac\nexit 0\n", log.display());
        std::fs::write(bin.join(name), body).unwrap();
        std::fs::set_permissions(bin.join(name), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    bin
}

/// A checkout with the build done, in the test's folder.
fn checkout(env: &Env) -> std::path::PathBuf {
    let checkout = env.dir.join("checkout");
    std::fs::create_dir_all(&checkout).unwrap();
    crate::quickstart::copy_checkout(&checkout);
    checkout
}

/// Runs the checkout's install.sh with `args`, PATH and a HOME of the test's.
fn install(env: &Env, checkout: &Path, path: &str, args: &[&str]) -> std::process::Output {
    Command::new("bash")
        .arg(checkout.join("install.sh"))
        .args(args)
        .env_clear()
        .env("PATH", path)
        .env("HOME", env.dir.join("user-home"))
        .env("USER", "someone")
        .env("SHINYCTL_HOME", env.home())
        .output()
        .unwrap()
}

#[test]
fn install_service_installs_the_unit_enables_it_and_lingering_and_says_so() {
    let env = Env::new("install-service");
    let checkout = checkout(&env);
    let prefix = env.dir.join("prefix");
    let fake = recorders(&env.dir, &["systemctl", "loginctl"]);
    let out = install(&env, &checkout, &format!("{}:/usr/bin:/bin", fake.display()), &["--service", "--prefix", prefix.to_str().unwrap()]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("not building again"), "the build is done: {stdout}");

    let unit = std::fs::read_to_string(env.dir.join("user-home/.config/systemd/user/shinyctl.service")).unwrap();
    let bin = prefix.join("bin/shinyctl");
    for line in [
        "Type=notify".to_string(),
        format!("ExecStart={} serve", bin.display()),
        format!("ExecReload={} reload", bin.display()),
        "#Environment=SHINYCTL_METRICS=127.0.0.1:9108".to_string(),
        "KillMode=process".to_string(),
    ] {
        assert!(unit.lines().any(|l| l == line), "{line} in the unit:\n{unit}");
    }
    let calls = std::fs::read_to_string(env.dir.join("calls.log")).unwrap();
    let calls: Vec<&str> = calls.lines().collect();
    let at = |call: &str| calls.iter().position(|c| *c == call).unwrap_or_else(|| panic!("{call} in {calls:?}"));
    assert!(at("systemctl --user daemon-reload") < at("systemctl --user enable --now shinyctl"), "{calls:?}");
    at("loginctl enable-linger someone");
    for said in
        ["ran: systemctl --user daemon-reload", "ran: systemctl --user enable --now shinyctl", "ran: loginctl enable-linger someone"]
    {
        assert!(stdout.contains(said), "it says what it did ({said}):\n{stdout}");
    }
}

#[test]
fn install_service_without_systemctl_says_so_and_fails() {
    let env = Env::new("install-nosystemd");
    let checkout = checkout(&env);
    // Every tool of the machine but systemctl.
    let tools = env.dir.join("tools");
    std::fs::create_dir_all(&tools).unwrap();
    for dir in ["/usr/bin", "/bin"] {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let name = entry.file_name();
            if name != "systemctl" && !tools.join(&name).exists() {
                std::os::unix::fs::symlink(entry.path(), tools.join(&name)).unwrap();
            }
        }
    }
    let prefix = env.dir.join("prefix");
    let out = install(&env, &checkout, tools.to_str().unwrap(), &["--service", "--prefix", prefix.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "no systemd: install.sh --service fails");
    assert!(stderr.contains("systemctl is not on PATH"), "{stderr}");
    assert!(!prefix.join("bin/shinyctl").exists(), "it says so before installing anything");
}
