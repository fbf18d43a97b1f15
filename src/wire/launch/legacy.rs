//! The launcher's command line as the build before the start spec wrote it:
//! one argument per setting (`--app-dir D --scratch S --entrypoint F --port
//! P --r-path R --copy N --app A --home H --sandbox JSON [--run-as U] [--uid
//! N] [--cgroup C]…`). A daemon reads it from `/proc/PID/cmdline` to adopt a
//! copy such a launcher started before an upgrade.

use std::ffi::OsString;
use std::path::PathBuf;

use super::{BadLaunchArgs, Launch};
use crate::manifest::StartSpec;

/// The arguments as `--key value` pairs, in order.
pub fn pairs(args: &[OsString]) -> Result<Vec<(String, OsString)>, BadLaunchArgs> {
    let mut out = Vec::with_capacity(args.len() / 2);
    let mut it = args.iter();
    while let Some(key) = it.next() {
        let key =
            key.to_str().filter(|k| k.starts_with("--")).ok_or_else(|| BadLaunchArgs::Unexpected(key.to_string_lossy().into_owned()))?;
        let value = it.next().ok_or_else(|| BadLaunchArgs::NoValue(key.to_string()))?;
        out.push((key.to_string(), value.clone()));
    }
    Ok(out)
}

/// A [`Launch`] from the per-setting arguments.
pub fn parse(pairs: &[(String, OsString)]) -> Result<Launch, BadLaunchArgs> {
    const KNOWN: [&str; 12] = [
        "--app-dir",
        "--scratch",
        "--entrypoint",
        "--port",
        "--r-path",
        "--copy",
        "--app",
        "--home",
        "--sandbox",
        "--run-as",
        "--uid",
        "--cgroup",
    ];
    if let Some((k, _)) = pairs.iter().find(|(k, _)| !KNOWN.contains(&k.as_str())) {
        return Err(BadLaunchArgs::Unexpected(k.clone()));
    }
    let opt = |key: &str| pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.to_string_lossy().into_owned());
    let text = |key: &str| opt(key).ok_or_else(|| BadLaunchArgs::Missing(key.to_string()));
    let bad = |key: &str, why: String| BadLaunchArgs::Value { key: key.to_string(), why };
    let number = |key: &str| text(key).and_then(|v| v.parse::<u64>().map_err(|e| bad(key, format!("{v}: {e}"))));
    let sandbox = serde_json::from_str(&text("--sandbox")?).map_err(|e| bad("--sandbox", format!("not a sandbox section: {e}")))?;
    Ok(Launch {
        home: PathBuf::from(text("--home")?),
        app: text("--app")?,
        copy: u32::try_from(number("--copy")?).map_err(|e| bad("--copy", e.to_string()))?,
        port: u16::try_from(number("--port")?).map_err(|e| bad("--port", e.to_string()))?,
        app_dir: PathBuf::from(text("--app-dir")?),
        scratch: PathBuf::from(text("--scratch")?),
        uid: opt("--uid").map(|v| v.parse::<u32>().map_err(|e| bad("--uid", format!("{v}: {e}")))).transpose()?,
        cgroups: pairs.iter().filter(|(k, _)| k == "--cgroup").map(|(_, v)| PathBuf::from(v)).collect(),
        pool: None,
        cold: None,
        start: StartSpec {
            working_dir: PathBuf::new(),
            entrypoint: text("--entrypoint")?,
            r_path: text("--r-path")?,
            env: Default::default(),
            sandbox,
            run_as: opt("--run-as"),
        },
    })
}
