//! The start spec: every setting that decides how a copy starts, as one
//! value. A release keeps the one it was deployed with (state.json's
//! `deployed`), the launcher gets it whole, and its hash tells an outdated
//! copy from a current one.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::collections::BTreeMap;
use std::path::PathBuf;

use super::Sandbox;

/// What decides how a copy starts. Changing any of it deploys a new release
/// and replaces the copies (see [`settings_hash`]).
///
/// Adding a start key: its field here with `#[serde(default,
/// skip_serializing_if = "…")]` that leaves it out at its default (so no
/// existing app's hash changes and files written before it still load), its
/// check in the manifest, and its use in the launcher. Nothing else lists it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StartSpec {
    /// `working-dir`, absolute; default the manifest's folder. A release is
    /// taken of it.
    pub working_dir: PathBuf,
    /// `entrypoint-file`, default `app.R`, relative to working-dir (and to
    /// the release).
    pub entrypoint: String,
    /// `r-path`, default `R` (found on PATH).
    pub r_path: String,
    /// `env`: extra environment for the copies.
    pub env: BTreeMap<String, String>,
    /// `sandbox`: how each copy is fenced (defaults when absent, as for a
    /// release recorded before the fence).
    #[serde(default, skip_serializing_if = "is_default")]
    pub sandbox: Sandbox,
    /// `run-as`: the user copies run as when the daemon is root; none: the
    /// daemon's own user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_as: Option<String>,
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

/// What the hash covers: the app's identity and its start spec.
#[derive(Serialize)]
struct Hashed<'a> {
    name: &'a str,
    group: &'a str,
    #[serde(flatten)]
    start: &'a StartSpec,
}

/// The hash of the app's identity (`app-name`, `app-group`) and its start
/// spec, over their serialized form with no list of fields. A field present
/// in every spec is hashed as its value (a map as its `k=v` entries); a field
/// left out at its default is hashed, when set, as `key=value` with the key
/// as the manifest spells it. Copies started with another hash are outdated.
pub fn settings_hash(name: &str, group: &str, start: &StartSpec) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    let always = always_written();
    for (key, raw) in fields(&Hashed { name, group, start }) {
        if always.contains(&key) {
            match serde_json::from_str::<serde_json::Value>(raw.get()) {
                Ok(serde_json::Value::String(s)) => part(&mut h, &[s.as_bytes()]),
                Ok(serde_json::Value::Object(map)) => {
                    for (k, v) in map {
                        part(&mut h, &[k.as_bytes(), b"=", text(&v).as_bytes()]);
                    }
                }
                _ => part(&mut h, &[raw.get().as_bytes()]),
            }
        } else {
            let value = match serde_json::from_str::<String>(raw.get()) {
                Ok(s) => s,
                Err(_) => raw.get().to_string(),
            };
            part(&mut h, &[key.replace('_', "-").as_bytes(), b"=", value.as_bytes()]);
        }
    }
    let digest = h.finalize();
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// One part of the hash: its pieces, then a NUL.
fn part(h: &mut sha2::Sha256, pieces: &[&[u8]]) {
    use sha2::Digest;
    for p in pieces {
        h.update(p);
    }
    h.update([0]);
}

/// A JSON value as text: a string as itself, anything else as JSON.
fn text(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The keys written even at their defaults: those a default spec has.
fn always_written() -> Vec<String> {
    fields(&Hashed { name: "", group: "", start: &StartSpec::default() }).into_iter().map(|(k, _)| k).collect()
}

/// A value's serialized fields in the order written, each as its JSON text.
fn fields(value: &impl Serialize) -> Vec<(String, Box<RawValue>)> {
    /// The fields of a JSON object in order (serde_json's map sorts them).
    struct InOrder(Vec<(String, Box<RawValue>)>);
    impl<'de> Deserialize<'de> for InOrder {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct Visit;
            impl<'de> serde::de::Visitor<'de> for Visit {
                type Value = InOrder;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("an object")
                }
                fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<InOrder, A::Error> {
                    let mut out = Vec::new();
                    while let Some(entry) = map.next_entry::<String, Box<RawValue>>()? {
                        out.push(entry);
                    }
                    Ok(InOrder(out))
                }
            }
            d.deserialize_map(Visit)
        }
    }
    // Both steps work on a struct of strings, maps and plain values: they
    // cannot fail, and an empty list would only change the hash.
    let json = serde_json::to_string(value).unwrap_or_default();
    serde_json::from_str::<InOrder>(&json).map(|o| o.0).unwrap_or_default()
}
