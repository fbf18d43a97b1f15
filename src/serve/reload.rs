//! `POST /v1/reload` (`shinyctl reload`, the unit's `ExecReload=`): every
//! registered app's manifest applied again from the path it was applied
//! from, one by one, exactly as `apply` would. A manifest that is gone or
//! bad is reported (which app, which file, why) and its app is left as it
//! is; the others go on.

use std::path::PathBuf;

use http_body_util::BodyExt;

use crate::model::{ActionReply, ApiError, ApplyRequest, ReloadReply, Reloaded};
use crate::uds;

use super::reply::Reply;
use super::Shared;

/// Applies every registered manifest again; answers what became of each.
pub async fn reload(shared: &Shared) -> Reply {
    let apps: Vec<(String, PathBuf)> = {
        let d = shared.lock();
        d.apps.iter().filter(|(_, a)| !a.recorded.deleting).map(|(n, a)| (n.clone(), a.recorded.spec.manifest.clone())).collect()
    };
    let mut reply = ReloadReply::default();
    for (app, path) in apps {
        let outcome = match tokio::fs::read_to_string(&path).await {
            Ok(text) => {
                let req = ApplyRequest { path: path.display().to_string(), text, now: false };
                outcome_of(super::deploy::apply(shared, req).await).await
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
    uds::json_response(hyper::StatusCode::OK, &reply)
}

/// apply's message when it applied, its error when it refused.
async fn outcome_of(reply: Reply) -> Result<String, String> {
    let status = reply.status();
    let body = reply.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    if status.is_success() {
        Ok(serde_json::from_slice::<ActionReply>(&body).map(|r| r.message).unwrap_or_default())
    } else {
        Err(serde_json::from_slice::<ApiError>(&body).map(|e| e.error).unwrap_or_else(|_| format!("apply answered {status}")))
    }
}
