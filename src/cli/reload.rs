//! `shinyctl reload`: every registered manifest applied again from its
//! path (the systemd unit's `ExecReload=`).

use crate::home::Home;
use crate::wire::api_client::Client;

/// Prints what became of each app; fails when any manifest could not be
/// applied (those apps run on as they were).
pub fn run(home: &Home) -> anyhow::Result<()> {
    let reply = Client::new(home).reload()?;
    if reply.apps.is_empty() {
        println!("No apps are registered; nothing to reload.");
        return Ok(());
    }
    for r in reply.apps.iter().filter(|r| r.ok) {
        println!("{}", r.message);
    }
    let failed: Vec<_> = reply.apps.iter().filter(|r| !r.ok).collect();
    for r in &failed {
        eprintln!("{}", r.message);
    }
    if !failed.is_empty() {
        anyhow::bail!("{} of {} manifests could not be applied; those apps run on as they were", failed.len(), reply.apps.len());
    }
    Ok(())
}
