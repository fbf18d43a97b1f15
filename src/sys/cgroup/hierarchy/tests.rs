//! The cgroup paths and files, read from text as this machine and a
//! systemd machine write them, and a copy's cgroup made in a plain folder.

use super::*;

const MOUNTINFO_V1: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
34 31 0:31 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw
";

const SELF_V1: &str = "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/d04e\n2:cpu,cpuacct:/\n0::/\n";

#[test]
fn the_hierarchies_and_the_daemons_place_in_them() {
    let mounts = parse_mountinfo(MOUNTINFO_V1);
    assert_eq!(mounts.len(), 4, "tmpfs and ext4 are no cgroups");
    let memory = mounts.iter().find(|m| m.options.iter().any(|o| o == "memory")).unwrap();
    assert_eq!((memory.point.as_path(), memory.v2), (Path::new("/sys/fs/cgroup/memory"), false));
    assert!(mounts.iter().any(|m| m.v2 && m.point == Path::new("/sys/fs/cgroup/unified")));
    assert_eq!(v1_path(SELF_V1, "memory").as_deref(), Some("/process_api/d04e"));
    assert_eq!(v1_path(SELF_V1, "cpuacct").as_deref(), Some("/"));
    assert_eq!(v1_path(SELF_V1, "blkio"), None);
    assert_eq!(below(memory, "/process_api/d04e"), Some(PathBuf::from("/sys/fs/cgroup/memory/process_api/d04e")));
    let nested = Mount { root: "/user.slice".into(), point: "/sys/fs/cgroup".into(), v2: true, options: vec![] };
    assert_eq!(below(&nested, "/user.slice/u.service"), Some(PathBuf::from("/sys/fs/cgroup/u.service")));
    assert_eq!(below(&nested, "/system.slice/x"), None, "outside what the mount shows");
}

#[test]
fn a_machine_without_cgroup_v2_controllers_is_no_v2() {
    let mounts = parse_mountinfo(MOUNTINFO_V1);
    assert!(v2("9:name=systemd:/\n", &mounts, false).unwrap_err().contains("no cgroup v2"));
    assert!(v2(SELF_V1, &[], false).unwrap_err().contains("not mounted"));
}

#[test]
fn oom_kill_counts() {
    assert_eq!(oom_kills("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"), Some(2));
    assert_eq!(oom_kills("low 0\nhigh 0\nmax 7\noom 1\noom_kill 1\noom_group_kill 0\n"), Some(1));
    assert_eq!(oom_kills("oom_kill_disable 0\n"), None);
}

/// A v1 layout in a plain folder: the files the kernel would hold are
/// written like any file, which is enough to see what is set and read.
#[test]
fn a_copys_cgroup_is_made_with_its_limits_read_and_removed() {
    let tmp_dir = tempfile::tempdir().unwrap();
    let root = tmp_dir.path().to_path_buf();
    let cg = Cgroups {
        kind: Kind::V1 { memory: Some(root.join("memory/shinyctl-t")), pids: Some(root.join("pids/shinyctl-t")) },
        missing: None,
    };
    assert!(cg.has_memory() && cg.has_pids());
    let dirs = cg.prepare("hello-2", Some(200 << 20), 64).unwrap();
    assert_eq!(dirs, vec![root.join("memory/shinyctl-t/hello-2"), root.join("pids/shinyctl-t/hello-2")]);
    let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap();
    assert_eq!(read("memory/shinyctl-t/hello-2/memory.limit_in_bytes"), (200u64 << 20).to_string());
    assert_eq!(read("pids/shinyctl-t/hello-2/pids.max"), "64");
    assert_eq!(cg.memory_sample("hello-2"), None, "no counter yet");
    std::fs::write(root.join("memory/shinyctl-t/hello-2/memory.oom_control"), "oom_kill_disable 0\noom_kill 1\n").unwrap();
    std::fs::write(root.join("memory/shinyctl-t/hello-2/memory.max_usage_in_bytes"), "209715100\n").unwrap();
    assert_eq!(cg.memory_sample("hello-2"), Some(CgroupSample { oom_kills: 1, peak: 209_715_100 }));
    assert!(!cg.holds_memory(std::process::id(), "hello-2"), "this test is in no such cgroup");
    // Without a memory limit only the pids cgroup is made.
    assert_eq!(cg.prepare("hello-3", None, 512).unwrap(), vec![root.join("pids/shinyctl-t/hello-3")]);
    std::fs::remove_dir(root.join("pids/shinyctl-t/hello-3")).ok();
    // A plain folder with files is never empty, unlike a cgroup: emptied here.
    for d in ["memory/shinyctl-t/hello-2", "pids/shinyctl-t/hello-2"] {
        for f in std::fs::read_dir(root.join(d)).unwrap() {
            std::fs::remove_file(f.unwrap().path()).unwrap();
        }
    }
    std::fs::create_dir_all(root.join("pids/shinyctl-t/hello-9")).unwrap();
    cg.sweep(&["hello-2".to_string()].into_iter().collect());
    assert!(!root.join("pids/shinyctl-t/hello-9").exists(), "no copy runs in it");
    assert!(root.join("pids/shinyctl-t/hello-2").is_dir(), "its copy runs");
    cg.remove("hello-2");
    assert!(!root.join("memory/shinyctl-t").exists(), "the empty tag folder goes too");
    let none = Cgroups { kind: Kind::None, missing: Some("no cgroup".into()) };
    assert_eq!(none.prepare("hello-2", Some(1 << 30), 64), Ok(vec![]));
    assert!(none.describe().contains("watches a limited copy's memory"));
    assert!(none.describe().contains("Delegate=yes"));
    assert!(matches!(cg.kind, Kind::V1 { memory: Some(_), pids: Some(_) }) && cg.missing.is_none());
}

/// cgroup v2 in a plain folder laid out as a delegated unit's cgroup:
/// the daemon goes into `daemon`, the copies under `copies`, the
/// controllers are enabled; a daemon started again from its leaf finds the
/// same place; the root cgroup and a cgroup without memory are refused.
#[test]
fn a_delegated_v2_cgroup_gets_the_daemon_into_its_leaf_and_the_copies_beside_it() {
    let tmp_dir = tempfile::tempdir().unwrap();
    let root = tmp_dir.path().to_path_buf();
    let unit = root.join("system.slice/shinyctl.service");
    std::fs::create_dir_all(&unit).unwrap();
    std::fs::write(unit.join("cgroup.controllers"), "cpu io memory pids\n").unwrap();
    std::fs::write(unit.join("cgroup.subtree_control"), "").unwrap();
    std::fs::write(unit.join("cgroup.procs"), "1\n").unwrap();
    let mount = Mount { root: "/".into(), point: root.clone(), v2: true, options: vec![] };
    let copies = v2("0::/system.slice/shinyctl.service\n", std::slice::from_ref(&mount), false).unwrap();
    assert_eq!(copies, unit.join("copies"));
    assert_eq!(std::fs::read_to_string(unit.join("daemon/cgroup.procs")).unwrap(), std::process::id().to_string(), "pid 1 is no shinyctl");
    assert_eq!(std::fs::read_to_string(unit.join("cgroup.subtree_control")).unwrap(), "+memory +pids");
    assert_eq!(std::fs::read_to_string(copies.join("cgroup.subtree_control")).unwrap(), "+memory +pids");
    let again = v2("0::/system.slice/shinyctl.service/daemon\n", std::slice::from_ref(&mount), false).unwrap();
    assert_eq!(again, copies, "a daemon started from the leaf uses its parent");

    let cg = Cgroups { kind: Kind::V2 { copies: copies.clone() }, missing: None };
    let dirs = cg.prepare("hello-1", Some(512 << 20), 100).unwrap();
    assert_eq!(dirs, vec![copies.join("hello-1")]);
    assert_eq!(std::fs::read_to_string(copies.join("hello-1/memory.max")).unwrap(), (512u64 << 20).to_string());
    assert_eq!(std::fs::read_to_string(copies.join("hello-1/pids.max")).unwrap(), "100");
    std::fs::write(copies.join("hello-1/memory.events"), "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n").unwrap();
    std::fs::write(copies.join("hello-1/memory.peak"), "536870912\n").unwrap();
    assert_eq!(cg.memory_sample("hello-1"), Some(CgroupSample { oom_kills: 1, peak: 512 << 20 }));
    assert_eq!(cg.prepare("hello-2", None, 512).unwrap(), vec![copies.join("hello-2")], "v2 holds pids too");
    assert_eq!(std::fs::read_to_string(copies.join("hello-2/memory.max")).unwrap(), "max");

    assert!(v2("0::/\n", std::slice::from_ref(&mount), false).unwrap_err().contains("root cgroup"));
    std::fs::write(unit.join("cgroup.controllers"), "cpu pids\n").unwrap();
    std::fs::remove_dir_all(unit.join("copies")).unwrap();
    let e = v2("0::/system.slice/shinyctl.service\n", std::slice::from_ref(&mount), false).unwrap_err();
    assert!(e.contains("memory controller is not delegated") && e.contains("Delegate=yes"), "{e}");
}

/// Under systemd (INVOCATION_ID set), the daemon takes its unit's cgroup
/// only when systemd started it in the `daemon` leaf (DelegateSubgroup=,
/// systemd 254+), even the first time, before `copies` exists; started in
/// the unit's cgroup itself, it enables no controller there, since systemd
/// could then not start the service again while copies run.
#[test]
fn under_systemd_the_unit_cgroup_is_taken_only_from_the_daemon_leaf() {
    let tmp_dir = tempfile::tempdir().unwrap();
    let root = tmp_dir.path().to_path_buf();
    let unit = root.join("system.slice/shinyctl.service");
    std::fs::create_dir_all(unit.join("daemon")).unwrap();
    std::fs::write(unit.join("cgroup.controllers"), "memory pids\n").unwrap();
    std::fs::write(unit.join("cgroup.subtree_control"), "").unwrap();
    let mount = Mount { root: "/".into(), point: root.clone(), v2: true, options: vec![] };
    let mounts = std::slice::from_ref(&mount);

    let e = v2("0::/system.slice/shinyctl.service\n", mounts, true).unwrap_err();
    assert!(e.contains("DelegateSubgroup=daemon") && e.contains("systemd 254"), "{e}");
    assert_eq!(std::fs::read_to_string(unit.join("cgroup.subtree_control")).unwrap(), "", "no controller enabled");

    let copies = v2("0::/system.slice/shinyctl.service/daemon\n", mounts, true).unwrap();
    assert_eq!(copies, unit.join("copies"), "the leaf's parent is the base, though copies did not exist yet");
    assert_eq!(std::fs::read_to_string(unit.join("cgroup.subtree_control")).unwrap(), "+memory +pids");
}

#[test]
fn a_cgroup_mounted_where_the_path_holds_a_blank_is_found_there() {
    let text = "35 31 0:32 /my\\040slice /sys/fs/cgroup/my\\040memory rw,relatime shared:9 - cgroup cgroup rw,memory\n";
    let mounts = parse_mountinfo(text);
    assert_eq!(mounts.len(), 1, "{mounts:?}");
    assert_eq!(mounts[0].point, Path::new("/sys/fs/cgroup/my memory"));
    assert_eq!(mounts[0].root, "/my slice");
    assert_eq!(below(&mounts[0], "/my slice/d04e"), Some(PathBuf::from("/sys/fs/cgroup/my memory/d04e")));
}
