use std::collections::BTreeMap;

use super::*;
use crate::wire::{AppState, CopyRecord, Release};

fn rel(id: &str, dir: &Path) -> Release {
    Release {
        id: id.into(),
        dir: dir.join(id),
        deployed: crate::manifest::StartSpec { env: BTreeMap::from([("V".into(), id.into())]), ..Default::default() },
        ..Default::default()
    }
}

fn copy(copy: u32, release: Option<&str>, pid: Option<u32>) -> CopyRecord {
    CopyRecord { copy, pid, release: release.map(str::to_string), ..Default::default() }
}

fn spec(dir: &Path) -> AppSpec {
    let manifest = dir.join("app.yaml");
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("app.R"), "").unwrap();
    std::fs::write(&manifest, "app-name: hello\nport: 8765\nenv:\n  V: manifest\n").unwrap();
    crate::manifest::parse(&manifest, &std::fs::read_to_string(&manifest).unwrap()).unwrap()
}

#[test]
fn ids_sort_by_time_and_differ() {
    let a = new_id(1_764_526_502_000); // 2025-11-30T18:15:02Z
    assert!(a.starts_with("20251130T181502-") && a.len() == 20, "{a}");
    assert!(new_id(1_764_526_503_000) > a);
    let many: HashSet<String> = (0..50).map(|_| new_id(1_764_526_502_000)).collect();
    assert!(many.len() > 40, "the random part tells ids of the same second apart");
}

#[test]
fn rollback_goes_to_the_last_release_that_served_before_the_current_one() {
    let tmp_dir = tempfile::tempdir().unwrap();
    let dir = tmp_dir.path().to_path_buf();
    let mut st = AppState::default();
    assert!(roll_back(&mut st, "hello", None).unwrap_err().to_string().contains("no release before the current one"));
    record(&mut st, rel("r1", &dir));
    assert!(roll_back(&mut st, "hello", None).unwrap_err().to_string().contains("deployed once"));
    record(&mut st, rel("r2", &dir));
    assert_eq!((st.release.as_deref(), st.previous_release.as_deref()), (Some("r2"), Some("r1")));
    assert!(roll_back(&mut st, "hello", None).unwrap_err().to_string().contains("is gone from"), "its folder must exist");
    assert_eq!(st.release.as_deref(), Some("r2"), "a refused rollback changes nothing");

    std::fs::create_dir_all(dir.join("r1")).unwrap();
    let back = roll_back(&mut st, "hello", None).unwrap();
    assert_eq!(back.deployed.env["V"], "r1", "it comes with the settings it was deployed with");
    assert_eq!((st.release.as_deref(), st.previous_release.as_deref(), st.rolled_back), (Some("r1"), Some("r2"), true));
    assert!(roll_back(&mut st, "hello", None).unwrap_err().to_string().contains("deployed once"), "nothing served before r1");
    // --to: any kept release, forward too.
    std::fs::create_dir_all(dir.join("r2")).unwrap();
    roll_back(&mut st, "hello", Some("r2")).unwrap();
    assert_eq!((st.release.as_deref(), st.rolled_back), (Some("r2"), false), "back on the newest release: nothing differs");
    assert!(roll_back(&mut st, "hello", Some("r9")).unwrap_err().to_string().contains("keeps no release r9; it keeps r1, r2"));
    assert!(roll_back(&mut st, "hello", Some("r2")).unwrap_err().to_string().contains("runs release r2 already"));

    // A release that never served is stepped over, and said when it is all there is.
    let mut broken = rel("r3", &dir);
    broken.served = Some(false);
    record(&mut st, broken);
    let mut fixed = rel("r4", &dir);
    fixed.served = Some(false);
    record(&mut st, fixed);
    assert!(!mark_served(&mut st, &[]), "nothing ready: nothing marked");
    st.copies = vec![copy(7, Some("r4"), Some(70))];
    assert!(mark_served(&mut st, &[7]), "r4's copy is ready: it served");
    assert_eq!(find(&st, "r4").unwrap().served, Some(true));
    roll_back(&mut st, "hello", None).unwrap();
    assert_eq!(st.release.as_deref(), Some("r2"), "r3 never served: the rollback goes past it to r2");
    let rows = rows(&st);
    assert_eq!(
        rows.iter().map(|r| (r.id.as_str(), r.current)).collect::<Vec<_>>(),
        [("r1", false), ("r2", true), ("r3", false), ("r4", false)]
    );
    assert_eq!(rows[3].running, [7]);
    let mut st = AppState::default();
    let mut never = rel("n1", &dir);
    never.served = Some(false);
    record(&mut st, never);
    record(&mut st, rel("n2", &dir));
    assert!(roll_back(&mut st, "hello", None).unwrap_err().to_string().contains("never got ready"));
}

#[test]
fn rollback_follows_the_deploy_order_a_rollback_made_not_the_order_taken() {
    // A, B, rollback to A, then C: the release deployed before C is A, and
    // B (which the operator rolled away from) is no target. Pruning keeps
    // by the same order.
    let tmp_dir = tempfile::tempdir().unwrap();
    let dir = tmp_dir.path().to_path_buf();
    let mut st = AppState::default();
    for id in ["a", "b", "c"] {
        std::fs::create_dir_all(dir.join(id)).unwrap();
    }
    record(&mut st, rel("a", &dir));
    record(&mut st, rel("b", &dir));
    roll_back(&mut st, "hello", None).unwrap();
    assert_eq!(st.release.as_deref(), Some("a"));
    record(&mut st, rel("c", &dir));
    assert_eq!(kept_ids(&st, 2), HashSet::from(["c".to_string(), "a".to_string()]), "the newest two by deploy order: c, then a");
    roll_back(&mut st, "hello", None).unwrap();
    assert_eq!(st.release.as_deref(), Some("a"), "back to what served before c, not to b");
    assert!(roll_back(&mut st, "hello", None).is_err(), "and no further: b and c were rolled away from");
    roll_back(&mut st, "hello", Some("b")).unwrap();
    roll_back(&mut st, "hello", None).unwrap();
    assert_eq!(st.release.as_deref(), Some("a"), "b, made current again with --to, rolls back to a");
}

#[test]
fn a_rollback_between_two_releases_of_the_same_second_is_a_rollback() {
    // The second deploy's random part sorts before the first's.
    let tmp_dir = tempfile::tempdir().unwrap();
    let dir = tmp_dir.path().to_path_buf();
    let (first, second) = ("20261201T070538-ffff", "20261201T070538-0001");
    let mut st = AppState::default();
    record(&mut st, rel(first, &dir));
    record(&mut st, rel(second, &dir));
    std::fs::create_dir_all(dir.join(first)).unwrap();
    roll_back(&mut st, "hello", None).unwrap();
    assert_eq!((st.release.as_deref(), st.rolled_back), (Some(first), true), "the first deploy's release runs: a rollback");
    std::fs::create_dir_all(dir.join(second)).unwrap();
    roll_back(&mut st, "hello", Some(second)).unwrap();
    assert_eq!((st.release.as_deref(), st.rolled_back), (Some(second), false), "back on the newest");
}

#[test]
fn releases_go_once_no_copy_runs_them_and_their_gone_copies_logs_with_them() {
    let dir = Path::new("/nonexistent");
    let mut st = AppState::default();
    for id in ["r1", "r2", "r3", "r4"] {
        record(&mut st, rel(id, dir));
    }
    // Copy 1 ran r1 and is gone; copy 2 ran r2 and drains; 3 and 4 run r4.
    st.copies =
        vec![copy(1, Some("r1"), None), copy(2, Some("r2"), Some(20)), copy(3, Some("r4"), Some(30)), copy(4, Some("r4"), Some(40))];
    note_copies(&mut st);
    st.copies.remove(0);
    let gone = unneeded(&mut st, 2);
    let gone: Vec<(&str, Vec<u32>)> = gone.iter().map(|(r, logs)| (r.id.as_str(), logs.clone())).collect();
    assert_eq!(gone, [("r1", vec![1])], "r2 runs, r3 is the one before r4, r4 is current");
    assert_eq!(st.releases.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), ["r2", "r3", "r4"]);
    assert_eq!(find(&st, "r4").unwrap().copies, [3, 4]);

    st.copies.retain(|r| r.copy != 2);
    let gone: Vec<String> = unneeded(&mut st, 2).into_iter().map(|(r, _)| r.id).collect();
    assert_eq!(gone, ["r2"], "once its last copy is gone");
}

#[test]
fn a_copy_runs_its_release_with_its_settings_and_one_from_before_releases_runs_working_dir() {
    let tmp_dir = tempfile::tempdir().unwrap();
    let dir = tmp_dir.path().to_path_buf();
    let spec = spec(&dir.join("app"));
    let mut st = AppState::default();
    let (folder, run) = run_dir(&spec, &st, &copy(1, None, None)).unwrap();
    assert_eq!((folder, run), (spec.start.working_dir.clone(), spec.clone()));

    record(&mut st, rel("r1", &dir));
    let err = run_dir(&spec, &st, &copy(2, Some("r1"), None)).unwrap_err().to_string();
    assert!(err.contains("is gone from") && err.contains("shinyctl restart hello"), "{err}");
    assert!(run_dir(&spec, &st, &copy(2, Some("r9"), None)).unwrap_err().to_string().contains("not recorded"));

    std::fs::create_dir_all(dir.join("r1")).unwrap();
    let (folder, run) = run_dir(&spec, &st, &copy(2, Some("r1"), None)).unwrap();
    assert_eq!(folder, dir.join("r1"));
    assert_eq!(run.start.env["V"], "r1", "the release's env, not the manifest's");
    assert_eq!(run.route.port, spec.route.port);
    assert_eq!(spec.with_start(&spec.start), spec);
    // The fence a release was deployed with comes back with it (rollback).
    let mut fenced = spec.clone();
    fenced.start.sandbox.memory = Some(1 << 30);
    fenced.start.run_as = Some("nobody".into());
    let back = spec.with_start(&fenced.start);
    assert_eq!((back.start.sandbox.memory, back.start.run_as.as_deref()), (Some(1 << 30), Some("nobody")));
    assert_ne!(back.settings_hash(), spec.settings_hash());
}

#[test]
fn status_says_which_copies_run_the_previous_version_and_that_a_rollback_differs_from_the_manifest() {
    let dir = Path::new("/nonexistent");
    let mut st = AppState::default();
    record(&mut st, rel("r1", dir));
    st.copies = vec![copy(1, Some("r1"), Some(10)), copy(2, Some("r1"), Some(11))];
    let alive = |r: &CopyRecord| r.pid.is_some();
    assert!(notes("hello", &st, &alive).is_empty(), "one version runs");

    record(&mut st, rel("r2", dir));
    st.copies.push(copy(3, Some("r2"), None));
    assert!(notes("hello", &st, &alive).is_empty(), "the new copy has no process yet");
    st.copies[2].pid = Some(12);
    assert_eq!(notes("hello", &st, &alive), ["hello: copies 1, 2 run the previous version (release r1); new copies run release r2."]);

    st.copies[1].pid = None;
    st.copies[0].release = None;
    assert_eq!(
        notes("hello", &st, &alive),
        ["hello: copy 1 runs the previous version (working-dir (from before releases)); new copies run release r2."]
    );

    st.copies = vec![copy(3, Some("r2"), Some(12))];
    let tmp_dir = tempfile::tempdir().unwrap();
    st.releases[0].dir = tmp_dir.path().to_path_buf();
    roll_back(&mut st, "hello", None).unwrap();
    assert_eq!(
        notes("hello", &st, &alive)[0],
        "hello: runs the rolled-back release r1, rolled back from r2; its manifest differs. `shinyctl restart hello` deploys the manifest again."
    );
}

#[test]
fn a_state_json_from_before_releases_reads_as_one_with_none() {
    let old = r#"{"app":"hello","revision":3,"next_copy":2,"copies":[{"copy":1,"pid":10,"pid_start":5,"port":20001,"revision":3,
        "settings":"ab","started_ms":1,"crashes":0,"last_exit":null,"drain_started_ms":null,"stop_started_ms":null,"left_down":null}]}"#;
    let st: AppState = serde_json::from_str(old).unwrap();
    assert_eq!((st.release.as_ref(), st.previous_release.as_ref(), st.rolled_back, st.releases.len()), (None, None, false, 0));
    assert_eq!(st.copies[0].release, None, "adopted as it is: it runs working-dir");
    assert!(notes("hello", &st, &|_| true).is_empty());
}

#[test]
fn a_release_leaves_out_the_state_files_of_every_app_and_their_second_names() {
    let tmp_dir = tempfile::tempdir().unwrap();
    let dir = tmp_dir.path().join("app");
    let spec = spec(&dir);
    let home = crate::home::Home { root: tmp_dir.path().join("home") };
    // Another app applied from a folder inside this one's working-dir.
    let other = dir.join("other/state.json");
    let src = source(&spec, &home, std::slice::from_ref(&other));
    for path in [dir.join("state.json"), dir.join("state.json.synced"), other.clone(), dir.join("other/state.json.synced")] {
        assert!(src.leave_out.contains(&path), "{}: {:?}", path.display(), src.leave_out);
    }
}

#[test]
fn a_current_release_whose_copies_all_failed_is_listed_failed_not_starting() {
    let dir = Path::new("/r");
    let (mut old, mut new) = (rel("a", dir), rel("b", dir));
    old.served = Some(true);
    new.served = Some(false);
    let mut broken = copy(2, Some("b"), None);
    broken.crashes = 2;
    let mut state = AppState {
        releases: vec![old, new],
        release: Some("b".into()),
        copies: vec![copy(1, Some("a"), Some(10)), broken],
        ..AppState::default()
    };
    let failed = |s: &AppState| rows(s).iter().find(|r| r.id == "b").map(|r| (r.current, r.failed));
    assert_eq!(failed(&state), Some((true, true)), "its copy crashed before it was ready");
    state.copies[1].ever_ready = true;
    assert_eq!(failed(&state), Some((true, false)), "ready once: a crash after is no failed deploy");
    state.copies[1] = copy(2, Some("b"), Some(11));
    assert_eq!(failed(&state), Some((true, false)), "still starting");
}
