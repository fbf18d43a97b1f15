//! Warming a spare: a warm copy gets a few `GET /` from the load balancer
//! once, when a table first names its process as warm, so the R code behind
//! its page has run (and R's byte-code compiler has compiled it) before a
//! visitor fails over to it. Measured with the hello app under load: a
//! copy's second page took 100–160 ms where the ones after took 40–80 ms,
//! and that second page was a failover's worst (the readiness probe asks
//! for no page: these are a spare's first). Active copies are not warmed:
//! they have visitors, and a woken copy's first visitor must not wait
//! behind a warm-up.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::proxy::copies::table::Table;
use crate::wire::Role;

/// Requests a spare gets: its second request is the slow one, a third
/// covers code that compiles on its second run.
const REQUESTS: usize = 3;
/// How long one warm-up request may take before the warm-up gives up.
const WAIT: Duration = Duration::from_secs(10);

/// Warms each warm copy of `table` not warmed yet.
pub fn warm(table: &Table) {
    for app in table.apps.iter().filter(|a| !a.asleep && !a.stopped) {
        for c in app.copies.iter().filter(|c| c.role == Role::Warm && c.pid != 0) {
            if !c.state.warmed.swap(true, Ordering::Relaxed) {
                tokio::spawn(run(app.name.clone(), c.copy, c.port));
            }
        }
    }
}

/// Sends the warm-up requests one after the other; stops at the first that
/// gets no answer (the copy is going, or busy: it is not ours to push).
async fn run(app: String, copy: u32, port: u16) {
    let started = std::time::Instant::now();
    for _ in 0..REQUESTS {
        if !matches!(tokio::time::timeout(WAIT, get(port)).await, Ok(true)) {
            tracing::debug!(app, copy, port, "warm-up of copy {copy} stopped: no answer");
            return;
        }
    }
    tracing::debug!(app, copy, port, "copy {copy} warmed in {:?}", started.elapsed());
}

/// True once `GET /` on the copy's port got a whole answer (read to the
/// end of the connection, HTTP/1.0 without keep-alive, and dropped).
async fn get(port: u16) -> bool {
    let attempt = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        s.write_all(b"GET / HTTP/1.0\r\nHost: 127.0.0.1\r\nUser-Agent: shinyctl-warm\r\n\r\n").await.ok()?;
        let mut buf = [0u8; 16 * 1024];
        let mut head = Vec::with_capacity(5);
        loop {
            let n = s.read(&mut buf).await.ok()?;
            if n == 0 {
                break;
            }
            let want = 5 - head.len();
            head.extend_from_slice(&buf[..n.min(want)]);
        }
        Some(head == b"HTTP/")
    };
    attempt.await.unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{LbPolicy, ProxyApp, ProxyCopy, ProxyTable};
    use tokio::net::TcpListener;

    /// App `web` with an active copy on `active` and a warm one on `spare`.
    fn table_of(active: &TcpListener, spare: &TcpListener) -> ProxyTable {
        let copy = |copy: u32, l: &TcpListener, role| ProxyCopy {
            copy,
            port: l.local_addr().unwrap().port(),
            role,
            pid: 4_000_000 + copy,
            r_pid: None,
        };
        ProxyTable {
            apps: vec![ProxyApp::for_tests("web", LbPolicy::First, vec![copy(1, active, Role::Active), copy(2, spare, Role::Warm)])],
        }
    }

    /// Answers one request on `l` with a small page; the request's head.
    async fn answer_one(l: &TcpListener) -> String {
        let (mut s, _) = tokio::time::timeout(Duration::from_secs(10), l.accept()).await.expect("a warm-up request").unwrap();
        let mut head = Vec::new();
        let mut b = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = s.read(&mut b).await.unwrap();
            assert!(n > 0, "the request ended before its head did");
            head.extend_from_slice(&b[..n]);
        }
        s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").await.unwrap();
        String::from_utf8_lossy(&head).into_owned()
    }

    #[tokio::test]
    async fn a_spare_gets_three_gets_once_and_an_active_copy_none() {
        let active = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let spare = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let source = table_of(&active, &spare);
        let first = Table::build(source.clone(), &[3; 32], &Table::default());
        warm(&first);
        for _ in 0..REQUESTS {
            let head = answer_one(&spare).await;
            assert!(head.starts_with("GET / HTTP/1.0\r\n") && head.contains("shinyctl-warm"), "{head}");
        }
        // The next push names the same process: it was warmed already.
        let next = Table::build(source, &[3; 32], &first);
        warm(&next);
        let more = tokio::time::timeout(Duration::from_millis(500), spare.accept()).await;
        assert!(more.is_err(), "a spare is warmed once, not at every push");
        let to_active = tokio::time::timeout(Duration::from_millis(50), active.accept()).await;
        assert!(to_active.is_err(), "an active copy gets no warm-up");
    }
}
