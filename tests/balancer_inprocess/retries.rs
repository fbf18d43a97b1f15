//! Stand-ins and retries.

use super::*;

// The real clock: with real sockets a paused one jumps to the next timer
// whenever the runtime waits on them, which a loaded machine makes likely.
#[tokio::test]
async fn a_refused_connect_goes_at_once_to_the_warm_copy_and_the_daemon_is_told() {
    let (warm, warm_seen) = backend(2).await;
    let mut rig =
        start(|port| table(port, LbPolicy::LeastConn, false, 30_000, &[(1, dead_port(), Role::Active), (2, warm, Role::Warm)])).await;
    let t = Instant::now();
    let a = get(rig.port, None).await;
    assert_eq!((a.status, a.copy()), (200, 2), "{a:?}");
    assert!(t.elapsed() < Duration::from_secs(5), "sent on at once, not held 15 s: {:?}", t.elapsed());
    assert!(a.placed().unwrap().starts_with(&format!("lb_{}=2.", rig.port)), "the visitor is placed on the stand-in");
    let call = rig.daemon.next().await;
    assert_eq!(call.path, "/v1/apps/web/stand-in");
    assert_eq!(call.body, serde_json::json!({"down": 1, "stand_in": 2}));
    drop(call);

    // Copy 1 is marked down: the next visitor goes straight to the warm
    // copy, and the daemon is not told twice.
    let b = get(rig.port, None).await;
    assert_eq!(b.copy(), 2);
    assert_eq!(warm_seen.load(Ordering::SeqCst), 2);
    rig.daemon.nothing_within(Duration::from_secs(2)).await;
}

#[tokio::test(start_paused = true)]
async fn a_request_lost_on_a_dying_connection_is_sent_again_unless_it_had_a_body() {
    let (port, seen) = flaky_backend(1, 1).await;
    let rig = start(|p| table(p, LbPolicy::First, false, 30_000, &[(1, port, Role::Active)])).await;
    let a = get(rig.port, None).await;
    assert_eq!((a.status, a.copy()), (200, 1), "{a:?}");
    assert_eq!(seen.load(Ordering::SeqCst), 2, "lost once, then answered");

    let (port, seen) = flaky_backend(1, 1).await;
    rig.proxy.push(table(rig.port, LbPolicy::First, false, 30_000, &[(1, port, Role::Active)])).await;
    let b = request(rig.port, "POST", None, "x=1").await;
    assert_eq!(b.status, 502, "a body cannot be sent twice: {b:?}");
    assert_eq!(seen.load(Ordering::SeqCst), 1);
}
