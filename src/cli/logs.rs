//! `shinyctl logs APP [--copy N] [-f]`.

use std::io::{Read, Seek, SeekFrom, Write};
use std::time::Duration;

use crate::api_client::Client;
use crate::home::Home;

/// Prints a copy's log; with `follow`, keeps printing what is appended
/// (and starts over when the log is rotated).
pub fn run(home: &Home, app: &str, copy: u32, follow: bool) -> anyhow::Result<()> {
    let reply = Client::new(home).logs(app, copy)?;
    let mut file =
        std::fs::File::open(&reply.path).map_err(|e| anyhow::anyhow!("{}: {e} (copy {copy} may not have started yet)", reply.path))?;
    let mut out = std::io::stdout().lock();
    let mut pos = std::io::copy(&mut file, &mut out)?;
    out.flush()?;
    if !follow {
        return Ok(());
    }
    loop {
        std::thread::sleep(Duration::from_millis(250));
        let len = std::fs::metadata(&reply.path).map(|m| m.len()).unwrap_or(0);
        if len < pos {
            pos = 0; // rotated: copied away and truncated
        }
        if len > pos {
            file.seek(SeekFrom::Start(pos))?;
            let mut buf = Vec::new();
            Read::by_ref(&mut file).take(len - pos).read_to_end(&mut buf)?;
            out.write_all(&buf)?;
            out.flush()?;
            pos += buf.len() as u64;
        }
    }
}
