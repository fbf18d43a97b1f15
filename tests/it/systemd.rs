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

/// Who runs install.sh: root, or a normal user (a uid with no entry in
/// /etc/passwd, as `USER=someone`).
#[derive(Clone, Copy, PartialEq)]
enum As {
    Root,
    User(u32),
}

/// Runs the checkout's install.sh with `args`, PATH and a HOME of the
/// test's, in a mount namespace of its own with an empty tmpfs over
/// /etc/systemd/system, so a system unit is never installed on the machine.
/// What install.sh put there is copied to `etc-systemd-system/`.
fn install(env: &Env, checkout: &Path, path: &str, who: As, args: &[&str]) -> std::process::Output {
    let home = env.dir.join("user-home");
    std::fs::create_dir_all(&home).unwrap();
    let quoted: Vec<String> = args.iter().map(|a| format!("'{a}'")).collect();
    let (chown, become_user) = match who {
        As::Root => (String::new(), String::new()),
        As::User(uid) => (
            format!("chmod 755 '{dir}' && chown -R {uid}:{uid} '{dir}'\n", dir = env.dir.display()),
            format!("setpriv --reuid={uid} --regid={uid} --clear-groups "),
        ),
    };
    let script = format!(
        "set -e\nmount -t tmpfs tmpfs /etc/systemd/system\n{chown}\
         set +e\n{become_user}env -i PATH='{path}' HOME='{home}' USER=someone SHINYCTL_HOME='{shinyctl_home}' \
         bash '{install}' {args}\nrc=$?\n\
         mkdir -p '{out}' && cp -a /etc/systemd/system/. '{out}/'\nexit $rc\n",
        home = home.display(),
        shinyctl_home = env.home().display(),
        install = checkout.join("install.sh").display(),
        args = quoted.join(" "),
        out = env.dir.join("etc-systemd-system").display(),
    );
    Command::new("unshare").args(["--mount", "--", "bash", "-c", &script]).output().unwrap()
}

/// `systemd-analyze verify` of an installed unit file (`--user` for a user
/// unit), with the man page its Documentation= names on MANPATH; asserts
/// it finds nothing wrong.
fn verify(env: &Env, unit: &Path, user: bool, prefix: &Path) {
    let runtime = env.dir.join("xdg-runtime");
    std::fs::create_dir_all(&runtime).unwrap();
    let mut cmd = Command::new("systemd-analyze");
    if user {
        cmd.arg("--user");
    }
    let out = cmd
        .arg("verify")
        .arg(unit)
        .env("XDG_RUNTIME_DIR", &runtime)
        .env("MANPATH", prefix.join("share/man"))
        .output()
        .expect("systemd-analyze (Debian's systemd package)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // DelegateSubgroup= is systemd 254's: an older one says it ignores it.
    let old_systemd = systemd_version() < 254;
    let ignored = |l: &str| l.trim().is_empty() || (old_systemd && l.contains("Unknown key 'DelegateSubgroup'"));
    let complaints: Vec<&str> = stderr.lines().filter(|l| !ignored(l)).collect();
    assert!(out.status.success() && complaints.is_empty(), "systemd-analyze verify {}:\n{stderr}", unit.display());
}

/// The version of the machine's systemd (`systemctl --version`).
fn systemd_version() -> u32 {
    let out = Command::new("systemctl").arg("--version").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// The lines of a unit file, for the asserts.
fn assert_lines(unit: &str, lines: &[String]) {
    for line in lines {
        assert!(unit.lines().any(|l| l == line), "{line} in the unit:\n{unit}");
    }
}

#[test]
fn install_service_as_a_user_installs_the_user_unit_enables_it_and_lingering_and_says_so() {
    let env = Env::new("install-service");
    let checkout = checkout(&env);
    let prefix = env.dir.join("prefix");
    let fake = recorders(&env.dir, &["systemctl", "loginctl"]);
    let path = format!("{}:/usr/bin:/bin", fake.display());
    let out = install(&env, &checkout, &path, As::User(4242), &["--service", "--prefix", prefix.to_str().unwrap()]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("not building again"), "the build is done: {stdout}");

    let unit_path = env.dir.join("user-home/.config/systemd/user/shinyctl.service");
    let unit = std::fs::read_to_string(&unit_path).unwrap();
    let bin = prefix.join("bin/shinyctl");
    assert_lines(
        &unit,
        &[
            "Type=notify".to_string(),
            format!("ExecStart={} serve", bin.display()),
            format!("ExecReload={} reload", bin.display()),
            "#Environment=SHINYCTL_METRICS=127.0.0.1:9108".to_string(),
            "KillMode=process".to_string(),
            "Delegate=yes".to_string(),
            "Documentation=man:shinyctl(1)".to_string(),
            "WantedBy=default.target".to_string(),
        ],
    );
    assert!(!unit.lines().any(|l| l.starts_with("User=")), "a user unit runs as its user:\n{unit}");
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
    assert!(std::fs::read_dir(env.dir.join("etc-systemd-system")).unwrap().next().is_none(), "no system unit for a user");
    verify(&env, &unit_path, true, &prefix);
}

#[test]
fn install_service_as_root_installs_the_system_unit_that_runs_as_root_and_starts_it_at_boot() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let env = Env::new("install-service-root");
    let checkout = checkout(&env);
    let prefix = env.dir.join("prefix");
    let fake = recorders(&env.dir, &["systemctl", "loginctl"]);
    let path = format!("{}:/usr/bin:/bin", fake.display());
    let out = install(&env, &checkout, &path, As::Root, &["--service", "--prefix", prefix.to_str().unwrap()]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");

    // Installed as /etc/systemd/system/shinyctl.service (in the test's own
    // mount namespace), from the repository's shinyctl-system.service.
    let unit_path = env.dir.join("etc-systemd-system/shinyctl.service");
    let unit = std::fs::read_to_string(&unit_path).unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"));
    let bin = prefix.join("bin/shinyctl");
    assert_lines(
        &unit,
        &[
            "Type=notify".to_string(),
            "User=root".to_string(),
            format!("ExecStart={} serve", bin.display()),
            format!("ExecReload={} reload", bin.display()),
            "KillMode=process".to_string(),
            "Delegate=yes".to_string(),
            "DelegateSubgroup=daemon".to_string(),
            "Documentation=man:shinyctl(1)".to_string(),
            "WantedBy=multi-user.target".to_string(),
        ],
    );
    assert!(!env.dir.join("user-home/.config/systemd/user/shinyctl.service").exists(), "no user unit for root");
    let calls = std::fs::read_to_string(env.dir.join("calls.log")).unwrap();
    let calls: Vec<&str> = calls.lines().collect();
    let at = |call: &str| calls.iter().position(|c| *c == call).unwrap_or_else(|| panic!("{call} in {calls:?}"));
    assert!(at("systemctl daemon-reload") < at("systemctl enable --now shinyctl"), "{calls:?}");
    assert!(!calls.iter().any(|c| c.contains("--user") || c.starts_with("loginctl")), "the system manager only: {calls:?}");
    for said in ["ran: systemctl daemon-reload", "ran: systemctl enable --now shinyctl"] {
        assert!(stdout.contains(said), "it says what it did ({said}):\n{stdout}");
    }
    verify(&env, &unit_path, false, &prefix);
}

#[test]
fn install_service_as_root_without_a_systemd_system_manager_says_so_and_installs_nothing() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let env = Env::new("install-no-manager");
    let checkout = checkout(&env);
    let prefix = env.dir.join("prefix");
    // The machine's own systemctl: systemd is not PID 1 here.
    assert!(!Path::new("/run/systemd/system").exists(), "this test wants a machine that systemd does not run");
    let out = install(&env, &checkout, "/usr/bin:/bin", As::Root, &["--service", "--prefix", prefix.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("systemctl does not answer: no systemd system manager"), "{stderr}");
    assert!(!stderr.contains("--user"), "root is not told about a user manager: {stderr}");
    assert!(!prefix.join("bin/shinyctl").exists(), "it says so before installing anything");
}

#[test]
fn install_help_prints_the_whole_help() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("install.sh");
    let out = Command::new("bash").arg(&script).arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    // Every option is there, and the help ends with its last sentence.
    for option in ["--service", "--prefix DIR", "--help", "/etc/systemd/system/shinyctl.service", "run-as"] {
        assert!(help.contains(option), "{option} in:\n{help}");
    }
    let text = std::fs::read_to_string(&script).unwrap();
    let header: Vec<&str> = text.lines().skip(1).take_while(|l| l.starts_with('#')).collect();
    assert_eq!(help.lines().count(), header.len(), "every line of the comment at the top:\n{help}");
    assert!(help.trim_end().ends_with("(your apps keep running)."), "{help}");
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
    let out = install(&env, &checkout, tools.to_str().unwrap(), As::User(4242), &["--service", "--prefix", prefix.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "no systemd: install.sh --service fails");
    assert!(stderr.contains("systemctl is not on PATH"), "{stderr}");
    assert!(!prefix.join("bin/shinyctl").exists(), "it says so before installing anything");
}
