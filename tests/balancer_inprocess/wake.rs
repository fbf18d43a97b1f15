//! Waking a sleeping app.

use super::*;

#[tokio::test(start_paused = true)]
async fn requests_for_a_sleeping_app_share_one_wake() {
    let mut rig = start(|port| table(port, LbPolicy::LeastConn, true, 30_000, &[])).await;
    let held: Vec<_> = (0..4).map(|_| tokio::spawn(get(rig.port, None))).collect();
    let wake = rig.daemon.next().await;
    assert_eq!(wake.path, "/v1/apps/web/wake");
    // All four arrive and join the wake before it ends.
    until("the four visitors to be taken in", || rig.proxy.open_connections() == 4).await;
    assert!(held.iter().all(|h| !h.is_finished()), "held while the app wakes");
    let (one, seen) = backend(1).await;
    rig.proxy.push(table(rig.port, LbPolicy::LeastConn, false, 30_000, &[(1, one, Role::Active)])).await;
    wake.answer.send(StatusCode::OK).unwrap();
    for h in held {
        let a = h.await.unwrap();
        assert_eq!((a.status, a.copy()), (200, 1), "{a:?}");
    }
    assert_eq!(seen.load(Ordering::SeqCst), 4);
    rig.daemon.nothing_within(Duration::from_secs(5)).await;
}

#[tokio::test(start_paused = true)]
async fn a_wake_slower_than_the_request_timeout_is_a_504_and_the_wait_is_capped_at_30_s() {
    // README, "Sleep": held up to the request-timeout, 30 seconds at
    // most.
    for (request_timeout_ms, waited) in [(5_000, Duration::from_secs(5)), (60_000, Duration::from_secs(30))] {
        let mut rig = start(|port| table(port, LbPolicy::LeastConn, true, request_timeout_ms, &[])).await;
        let t = Instant::now();
        let held = tokio::spawn(get(rig.port, None));
        // Never answered while the request waits.
        let _wake = rig.daemon.next().await;
        tokio::time::sleep_until(t + waited - Duration::from_millis(200)).await;
        assert!(!held.is_finished(), "still waiting for the wake ({request_timeout_ms} ms)");
        let a = held.await.unwrap();
        assert_eq!(a.status, 504, "{a:?}");
        assert!(a.body.contains("web is still waking up"), "{a:?}");
        assert!(t.elapsed() < waited + Duration::from_millis(500), "answered at {waited:?}: {:?}", t.elapsed());
    }
}

#[tokio::test(start_paused = true)]
async fn a_wake_that_fails_is_a_503() {
    let mut rig = start(|port| table(port, LbPolicy::LeastConn, true, 30_000, &[])).await;
    let held = tokio::spawn(get(rig.port, None));
    let wake = rig.daemon.next().await;
    assert_eq!(wake.path, "/v1/apps/web/wake");
    wake.answer.send(StatusCode::SERVICE_UNAVAILABLE).unwrap();
    let a = held.await.unwrap();
    assert_eq!(a.status, 503, "{a:?}");
    assert!(a.body.contains("web did not start"), "{a:?}");
}

#[tokio::test(start_paused = true)]
async fn a_wake_asked_while_the_daemon_restarts_waits_for_it() {
    // An upgrade restarts shinyctl-api: for a moment nothing answers on its
    // socket. A visitor waking the app then is held, not sent away with
    // "could not be woken", and the wake is asked again until it answers.
    let mut rig = start(|port| table(port, LbPolicy::LeastConn, true, 30_000, &[])).await;
    let sock = rig._dir.path().join("api.sock");
    std::fs::remove_file(&sock).unwrap();
    let held = tokio::spawn(get(rig.port, None));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!held.is_finished(), "held while no daemon answers");
    rig.daemon = Daemon::serve(&sock);
    let wake = rig.daemon.next().await;
    assert_eq!(wake.path, "/v1/apps/web/wake");
    let (one, _) = backend(1).await;
    rig.proxy.push(table(rig.port, LbPolicy::LeastConn, false, 30_000, &[(1, one, Role::Active)])).await;
    wake.answer.send(StatusCode::OK).unwrap();
    let a = held.await.unwrap();
    assert_eq!((a.status, a.copy()), (200, 1), "{a:?}");
}
