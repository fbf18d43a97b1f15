//! Capacity (README, "Capacity").

use super::*;

/// [`table`] with `max-sessions` and `max-replicas`.
fn capacity_table(port: u16, max_sessions: u32, max_replicas: u32, request_timeout_ms: u64, copies: &[(u32, u16, Role)]) -> ProxyTable {
    let mut t = table(port, LbPolicy::LeastConn, false, request_timeout_ms, copies);
    t.apps[0].max_sessions = Some(max_sessions);
    t.apps[0].max_replicas = max_replicas;
    t
}

#[tokio::test(start_paused = true)]
async fn a_visitor_past_every_active_copys_max_sessions_goes_to_the_spare_at_once_and_the_daemon_is_told_once() {
    let (one, _) = backend(1).await;
    let (two, _) = backend(2).await;
    let mut rig = start(|port| capacity_table(port, 2, 3, 30_000, &[(1, one, Role::Active), (2, two, Role::Warm)])).await;
    // Two page loads fill copy 1: each counts until its WebSocket opens.
    let first = get(rig.port, None).await;
    let second = get(rig.port, None).await;
    assert_eq!((first.copy(), second.copy()), (1, 1));
    let a = get(rig.port, None).await;
    assert_eq!((a.status, a.copy()), (200, 2), "the spare takes the third at once: {a:?}");
    assert!(a.placed().unwrap().starts_with(&format!("lb_{}=2.", rig.port)), "and it is placed there");
    let call = rig.daemon.next().await;
    assert_eq!(call.path, "/v1/apps/web/stand-in");
    assert_eq!(call.body, serde_json::json!({"stand_in": 2, "full": true}));
    drop(call);
    // A visitor with a cookie keeps its full copy.
    let back = get(rig.port, first.placed().as_deref()).await;
    assert_eq!(back.copy(), 1, "a sticky visitor keeps its copy, full or not");
    let b = get(rig.port, None).await;
    assert_eq!(b.copy(), 2);
    rig.daemon.nothing_within(Duration::from_secs(2)).await;
    // With the spare full too and none ready behind it, the least full
    // active copy takes the visitor over max-sessions: never held while the
    // app can grow.
    let t = Instant::now();
    let c = get(rig.port, None).await;
    assert_eq!((c.status, c.copy()), (200, 1), "{c:?}");
    assert!(t.elapsed() < Duration::from_millis(500), "not held: {:?}", t.elapsed());
}

#[tokio::test(start_paused = true)]
async fn at_max_replicas_with_every_copy_full_a_visitor_is_held_for_a_free_place_then_gets_the_busy_page() {
    let (one, _) = backend(1).await;
    let (two, _) = backend(2).await;
    let rig = start(|port| capacity_table(port, 1, 1, 5_000, &[(1, one, Role::Active), (2, two, Role::Warm)])).await;
    assert_eq!(get(rig.port, None).await.copy(), 1);
    let t = Instant::now();
    let busy = get(rig.port, None).await;
    let held = t.elapsed();
    assert_eq!(busy.status, 503, "{busy:?}");
    assert!(busy.header("retry-after").is_some(), "{busy:?}");
    assert!(busy.body.contains("web is busy") && busy.body.contains("http-equiv=\"refresh\""), "a page that reloads itself: {busy:?}");
    assert!(held >= Duration::from_secs(5) && held < Duration::from_secs(6), "held for request-timeout: {held:?}");
    // The first visitor's place counts 30 s at most without its WebSocket:
    // a visitor held as it frees gets in then, not at its request-timeout.
    tokio::time::sleep_until(t + Duration::from_secs(27)).await;
    let t = Instant::now();
    let late = get(rig.port, None).await;
    assert_eq!((late.status, late.copy()), (200, 1), "{late:?}");
    let waited = t.elapsed();
    assert!(waited >= Duration::from_secs(2) && waited < Duration::from_secs(4), "held until the place freed: {waited:?}");
}

/// A copy that answers each request with what it got of its body: its
/// length, how it was framed, and the body itself.
async fn body_backend() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let svc = hyper::service::service_fn(|req: hyper::Request<hyper::body::Incoming>| async move {
                let chunked = req.headers().get("transfer-encoding").is_some_and(|v| v == "chunked");
                let got = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                let body = format!("{} bytes, chunked: {chunked}, {}", got.len(), String::from_utf8_lossy(&got));
                Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from(body))))
            });
            tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc));
        }
    });
    port
}

/// A copy that answers every request with bytes that are no HTTP answer.
async fn garbage_backend() -> (u16, Arc<AtomicUsize>) {
    raw_backend(|mut stream, counter| async move {
        let mut b = [0; 4096];
        if stream.read(&mut b).await.unwrap_or(0) > 0 {
            counter.fetch_add(1, Ordering::SeqCst);
            let _ = stream.write_all(b"SPDY/9 what\r\n\r\n").await;
        }
    })
    .await
}

#[tokio::test]
async fn request_bodies_reach_the_copy_whole_by_length_or_chunked() {
    let copy = body_backend().await;
    let rig = start(|p| table(p, LbPolicy::First, false, 30_000, &[(1, copy, Role::Active)])).await;
    let by_length = request(rig.port, "POST", None, "hello, copy").await;
    assert_eq!((by_length.status, by_length.body.as_str()), (200, "11 bytes, chunked: false, hello, copy"), "{by_length:?}");
    let chunked = raw_request(
        rig.port,
        "POST / HTTP/1.1\r\nHost: test\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n7\r\n, world\r\n0\r\n\r\n",
    )
    .await;
    assert_eq!((chunked.status, chunked.body.as_str()), (200, "12 bytes, chunked: true, hello, world"), "{chunked:?}");
    let empty = request(rig.port, "POST", None, "").await;
    assert_eq!((empty.status, empty.body.as_str()), (200, "0 bytes, chunked: false, "), "{empty:?}");
}

#[tokio::test]
async fn a_copy_whose_answer_does_not_read_is_passed_over_for_a_get_and_a_post_gets_a_502() {
    let (bad, bad_seen) = garbage_backend().await;
    let (good, good_seen) = backend(2).await;
    let rig = start(|p| table(p, LbPolicy::First, false, 30_000, &[(1, bad, Role::Active), (2, good, Role::Active)])).await;
    let a = get(rig.port, None).await;
    assert_eq!((a.status, a.copy()), (200, 2), "a GET is sent once more, to the other copy: {a:?}");
    assert_eq!((bad_seen.load(Ordering::SeqCst), good_seen.load(Ordering::SeqCst)), (1, 1));
    let b = request(rig.port, "POST", None, "x").await;
    assert_eq!(b.status, 502, "a POST is never sent twice: {b:?}");
    assert_eq!((bad_seen.load(Ordering::SeqCst), good_seen.load(Ordering::SeqCst)), (2, 1));
}

/// A copy that answers every request with a head declaring `declared`
/// bytes and only the first `sent` of them, then closes the connection
/// (`hold: false`: a copy killed between httpuv's two writes) or keeps it
/// open and silent for a minute (`hold: true`: a long answer still coming).
/// Counts the requests it read.
async fn cut_backend(declared: usize, sent: usize, hold: bool) -> (u16, Arc<AtomicUsize>) {
    raw_backend(move |mut stream, counter| async move {
        let mut head = Vec::new();
        let mut buf = [0u8; 4096];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(k) => head.extend_from_slice(&buf[..k]),
            }
        }
        counter.fetch_add(1, Ordering::SeqCst);
        let answer = format!("HTTP/1.1 200 OK\r\nContent-Length: {declared}\r\n\r\n{}", "x".repeat(sent));
        let _ = stream.write_all(answer.as_bytes()).await;
        if hold {
            tokio::time::sleep(Duration::from_secs(60)).await;
        }
    })
    .await
}

#[tokio::test]
async fn a_get_whose_short_answer_breaks_off_is_answered_whole_by_another_copy() {
    let (cut, cut_seen) = cut_backend(10, 4, false).await;
    let (good, good_seen) = backend(2).await;
    let rig = start(|p| table(p, LbPolicy::First, false, 30_000, &[(1, cut, Role::Active), (2, good, Role::Active)])).await;
    let a = get(rig.port, None).await;
    assert_eq!((a.status, a.body.as_str()), (200, "copy=2;"), "the visitor gets none of the cut answer: {a:?}");
    assert_eq!((cut_seen.load(Ordering::SeqCst), good_seen.load(Ordering::SeqCst)), (1, 1));
    // A POST is never sent twice: its answer streams, cut as it is.
    let mut post = tokio::net::TcpStream::connect(("127.0.0.1", rig.port)).await.unwrap();
    post.write_all(b"POST / HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Length: 1\r\n\r\nx").await.unwrap();
    let mut got = Vec::new();
    let _ = timeout(DEADLINE, post.read_to_end(&mut got)).await.expect("the POST's connection ends");
    let got = String::from_utf8_lossy(&got);
    assert!(!got.contains("copy=2"), "a POST went to a second copy: {got:?}");
    assert_eq!((cut_seen.load(Ordering::SeqCst), good_seen.load(Ordering::SeqCst)), (1 + 1, 1));
}

#[tokio::test]
async fn a_get_whose_answer_is_long_gets_its_head_before_the_body_is_whole() {
    let (slow, _) = cut_backend(300 * 1024, 1024, true).await;
    let rig = start(|p| table(p, LbPolicy::First, false, 30_000, &[(1, slow, Role::Active)])).await;
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", rig.port)).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    // The copy holds the rest of its answer for a minute: the head and the
    // first KiB come now, streamed, not held until the answer is whole.
    timeout(Duration::from_secs(10), async {
        while got.len() < 1024 || !got.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "the answer ended: {:?}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .expect("the long answer's head and first bytes, before its end");
    assert!(got.starts_with(b"HTTP/1.1 200"), "{:?}", String::from_utf8_lossy(&got));
}
