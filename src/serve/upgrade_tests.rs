//! Files written before the settings split (`tests/fixtures/before-split/`,
//! written by the code of then: one app at the defaults, one with an older
//! registry entry and release that lack the later keys) still load, and no
//! copy they record counts as outdated: upgrading shinyctl redeploys nothing.

use std::path::{Path, PathBuf};

use crate::home::Home;
use crate::release;
use crate::serve::state_files::{load_registry, load_state};

/// Each fixture app's settings hash as the code before the split computed it.
const HASHES_BEFORE: [(&str, &str); 5] = [
    ("plain", "d78cab8e9c11ca6c"),
    ("with-env", "2795786f5c0692cc"),
    ("fenced", "34135c2adaafb82c"),
    ("as-user", "4abdef479159cdf3"),
    ("ui", "415b2b9b7d67f1e7"),
];

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/before-split")
}

/// A home whose registry.json is the fixture's.
fn home_with_fixture_registry() -> (tempfile::TempDir, Home) {
    let root = tempfile::tempdir().unwrap();
    let home = Home { root: root.path().to_path_buf() };
    std::fs::copy(fixtures().join("registry.json"), home.registry()).unwrap();
    (root, home)
}

#[test]
fn the_settings_hash_of_an_app_applied_before_is_unchanged() {
    let (root, home) = home_with_fixture_registry();
    let registry = load_registry(&home).expect("a registry.json of the form before the split loads");
    drop(root);
    assert_eq!(registry.apps.len(), HASHES_BEFORE.len());
    for (name, before) in HASHES_BEFORE {
        let spec = &registry.apps[name];
        assert_eq!(spec.settings_hash(), before, "{name}: the hash changed, so upgrading would restart its copies");
    }
}

#[test]
fn no_copy_recorded_before_counts_as_outdated() {
    let (root, home) = home_with_fixture_registry();
    let registry = load_registry(&home).unwrap();
    drop(root);
    for (name, spec) in &registry.apps {
        let state = load_state(&fixtures().join(format!("{name}.state.json"))).expect("a state.json of the form before the split loads");
        let rel = release::find(&state, state.release.as_deref().unwrap()).unwrap();
        // A rollback puts the release's start settings back in the spec: the
        // same settings give the same hash.
        assert_eq!(spec.with_start(&rel.deployed), *spec, "{name}: the release was deployed with the spec's settings");
        assert!(!state.copies.is_empty());
        for rec in &state.copies {
            assert_eq!(rec.settings, spec.settings_hash(), "{name}: copy {} would count as outdated", rec.copy);
            assert_eq!(rec.revision, state.revision);
        }
    }
}

#[test]
fn the_copies_table_keeps_the_form_the_previous_load_balancer_reads() {
    let (root, home) = home_with_fixture_registry();
    let registry = load_registry(&home).unwrap();
    drop(root);
    let spec = &registry.apps["ui"];
    let app = crate::wire::ProxyApp {
        name: spec.name.clone(),
        route: spec.route.clone(),
        asleep: false,
        listening: true,
        stopped: false,
        down: false,
        max_sessions: spec.scale.max_sessions,
        max_replicas: spec.scale.max_active(),
        copies: Vec::new(),
    };
    let json = serde_json::to_value(&app).unwrap();
    // The keys and text forms the load balancer before the route spec reads.
    assert_eq!(json["host"], "127.0.0.1");
    assert_eq!(json["port"], 8800);
    assert_eq!(json["policy"], "round-robin");
    assert_eq!(json["request_timeout_ms"], 30000);
    assert_eq!(json["max_connections"], 100);
    assert_eq!(json["trusted_proxies"], serde_json::json!(["10.0.0.0/8", "192.168.1.7"]));
    let back: crate::wire::ProxyApp = serde_json::from_value(json).unwrap();
    assert_eq!(back, app);
}
