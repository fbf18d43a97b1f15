//! `POST /v1/reload` (`shinyctl reload`, the unit's `ExecReload=`): every
//! registered app's manifest applied again from the path it was applied
//! from, one by one, exactly as `apply` would. A manifest that is gone or
//! bad is reported (which app, which file, why) and its app is left as it
//! is; the others go on.

use std::path::PathBuf;

use crate::wire::{ApplyRequest, ReloadReply, Reloaded};

use crate::serve::Shared;

/// Applies every registered manifest again; answers what became of each.
pub async fn reload(shared: &Shared) -> ReloadReply {
    let apps: Vec<(String, PathBuf)> = {
        let d = shared.lock();
        d.apps.iter().filter(|(_, a)| !a.recorded.deleting).map(|(n, a)| (n.clone(), a.recorded.spec.manifest.clone())).collect()
    };
    let mut reply = ReloadReply::default();
    for (app, path) in apps {
        let outcome = match tokio::fs::read_to_string(&path).await {
            Ok(text) => {
                let req = ApplyRequest { path: path.display().to_string(), text, now: false, keep_rollback: true };
                crate::serve::deploys::deploy::apply(shared, req).await.map(|done| done.message).map_err(|e| e.to_string())
            }
            Err(e) => Err(format!("cannot read {} ({e}); if it moved, apply it from where it is now", path.display())),
        };
        if let Err(why) = &outcome {
            tracing::warn!(app, manifest = %path.display(), "reload left the app as it is: {why}");
        }
        let ok = outcome.is_ok();
        let message = outcome.unwrap_or_else(|why| format!("{app}: not reloaded from {}; it runs on as it was: {why}", path.display()));
        reply.apps.push(Reloaded { app, manifest: path.display().to_string(), ok, message });
    }
    reply
}
