//! Holding a request.

use super::*;

#[tokio::test(start_paused = true)]
async fn with_no_copy_up_a_request_is_held_until_a_table_brings_one() {
    let rig = start(|port| table(port, LbPolicy::LeastConn, false, 30_000, &[])).await;
    let (one, _) = backend(1).await;
    let t = Instant::now();
    let held = tokio::spawn(get(rig.port, None));
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(!held.is_finished(), "held while no copy can take it");
    rig.proxy.push(table(rig.port, LbPolicy::LeastConn, false, 30_000, &[(1, one, Role::Active)])).await;
    let a = held.await.unwrap();
    assert_eq!((a.status, a.copy()), (200, 1), "{a:?}");
    assert!(t.elapsed() < Duration::from_millis(10_500), "answered as the table came: {:?}", t.elapsed());
}

// The real clock, as above.
#[tokio::test]
async fn a_request_that_reaches_an_app_being_deleted_is_answered_by_its_draining_copy() {
    // `delete` (with or without --now): the port closes, the copies drain
    // for a moment at least. A request on a connection accepted before
    // that (a keep-alive one here) is answered, not held for a copy that
    // will never come.
    let (one, _) = backend(1).await;
    let rig = start(|port| table(port, LbPolicy::LeastConn, false, 30_000, &[(1, one, Role::Active)])).await;
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", rig.port)).await.unwrap();
    stream.write_all(b"GET / HTTP/1.1\r\nHost: test\r\n\r\n").await.unwrap();
    let mut got = Vec::new();
    while !String::from_utf8_lossy(&got).contains("copy=1;") {
        let mut buf = [0u8; 4096];
        let n = timeout(DEADLINE, stream.read(&mut buf)).await.expect("an answer").unwrap();
        assert!(n > 0, "the first answer: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    let mut deleting = table(rig.port, LbPolicy::LeastConn, false, 30_000, &[(1, one, Role::Draining)]);
    deleting.apps[0].listening = false;
    rig.proxy.push(deleting).await;
    let t = Instant::now();
    stream.write_all(b"GET / HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").await.unwrap();
    let mut raw = Vec::new();
    timeout(DEADLINE, stream.read_to_end(&mut raw)).await.expect("an answer").unwrap();
    let raw = String::from_utf8_lossy(&raw);
    assert!(raw.starts_with("HTTP/1.1 200") && raw.contains("copy=1;"), "{raw}");
    assert!(t.elapsed() < Duration::from_secs(5), "at once, not after a 15 s hold: {:?}", t.elapsed());
    // While the app listens, a draining copy still gets no new visitor.
    let (two, _) = backend(2).await;
    rig.proxy.push(table(rig.port, LbPolicy::LeastConn, false, 30_000, &[(1, one, Role::Draining), (2, two, Role::Active)])).await;
    assert_eq!(get(rig.port, None).await.copy(), 2);
}

#[tokio::test(start_paused = true)]
async fn past_the_15_s_hold_a_request_gets_the_restarting_page() {
    // README, "Staying up": "a request waits up to 15 seconds".
    let mut rig = start(|port| table(port, LbPolicy::LeastConn, false, 30_000, &[(1, dead_port(), Role::Active)])).await;
    let t = Instant::now();
    let held = tokio::spawn(get(rig.port, None));
    let call = rig.daemon.next().await;
    assert_eq!((call.path.as_str(), &call.body), ("/v1/apps/web/stand-in", &serde_json::json!({"down": 1, "stand_in": null})));
    tokio::time::sleep_until(t + Duration::from_millis(14_800)).await;
    assert!(!held.is_finished(), "still held at 14.8 s");
    let a = held.await.unwrap();
    assert_eq!(a.status, 503, "{a:?}");
    assert!(a.body.contains("web is restarting"), "{a:?}");
    assert_eq!(a.header("retry-after"), Some("5"));
    assert!(t.elapsed() < Duration::from_millis(15_500), "answered at 15 s: {:?}", t.elapsed());
}

#[tokio::test(start_paused = true)]
async fn an_app_whose_copies_are_all_left_down_is_said_down_at_once_not_held() {
    // restart-policy `never` after every copy exited, or the fence refusing
    // each: nothing will bring a copy, so no hold.
    let mut down = table(0, LbPolicy::LeastConn, false, 30_000, &[]);
    down.apps[0].down = true;
    let rig = start(|port| {
        down.apps[0].route.port = port;
        down
    })
    .await;
    let t = Instant::now();
    let a = get(rig.port, None).await;
    assert_eq!(a.status, 503, "{a:?}");
    assert!(a.body.contains("is down"), "{a:?}");
    assert!(t.elapsed() < Duration::from_secs(1), "at once: {:?}", t.elapsed());
    let h = get_path(rig.port, "/.shinyctl/health", "").await;
    assert_eq!(h.status, 503, "a front proxy's check sees it down: {h:?}");
}

#[tokio::test]
async fn the_health_check_says_down_while_no_copy_can_take_a_new_visitor() {
    // README, "Several machines": a front load balancer sends visitors to
    // another host while this one's app has no copy for them (starting,
    // crash-looping); a sleeping app is up (a request wakes it).
    // (asleep, copies, the check's status)
    type Case = (bool, &'static [(u32, u16, Role)], u16);
    let cases: [Case; 5] = [
        (false, &[], 503),
        (true, &[], 200),
        (false, &[(1, 1, Role::Active)], 200),
        (false, &[(1, 1, Role::Warm)], 200),
        (false, &[(1, 1, Role::Draining)], 503),
    ];
    for (asleep, copies, want) in cases {
        let t = table(0, LbPolicy::LeastConn, asleep, 30_000, copies);
        let rig = start(|port| {
            let mut t = t;
            t.apps[0].route.port = port;
            t
        })
        .await;
        let h = get_path(rig.port, "/.shinyctl/health", "").await;
        assert_eq!(h.status, want, "asleep {asleep}, copies {copies:?}: {h:?}");
    }
}
