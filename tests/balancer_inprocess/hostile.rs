//! Bounded under hostile clients: retries and deaths, forwarded headers,
//! connection caps, limits by progress, stalled copies.

use super::*;

#[tokio::test(start_paused = true)]
async fn a_lost_get_is_sent_once_to_another_copy_and_a_post_never() {
    let (one, one_seen) = flaky_backend(1, 1).await;
    let (two, two_seen) = backend(2).await;
    let copies = [(1, one, Role::Active), (2, two, Role::Active)];
    let rig = start(|p| table(p, LbPolicy::First, false, 30_000, &copies)).await;
    let a = get(rig.port, None).await;
    assert_eq!((a.status, a.copy()), (200, 2), "{a:?}");
    assert_eq!((one_seen.load(Ordering::SeqCst), two_seen.load(Ordering::SeqCst)), (1, 1), "lost on copy 1, answered by copy 2");

    let (one, one_seen) = flaky_backend(1, usize::MAX).await;
    rig.proxy.push(table(rig.port, LbPolicy::First, false, 30_000, &[(1, one, Role::Active), (2, two, Role::Active)])).await;
    for method in ["POST", "PUT", "DELETE"] {
        let before = two_seen.load(Ordering::SeqCst);
        let b = request(rig.port, method, None, "").await;
        assert_eq!(b.status, 502, "{method}: {b:?}");
        assert_eq!(two_seen.load(Ordering::SeqCst), before, "{method} is never sent again");
    }
    let lost_twice = get(rig.port, None).await;
    assert_eq!(lost_twice.copy(), 2);
    assert_eq!(one_seen.load(Ordering::SeqCst), 4, "each request reached copy 1 once");
}

#[tokio::test(start_paused = true)]
async fn a_request_in_flight_at_two_copy_deaths_is_answered_502_at_once_for_a_minute() {
    // Copies 1 and 2 die with every request (their process is gone: a pid
    // no process has); copy 3 is healthy.
    let (one, one_seen) = flaky_backend(1, usize::MAX).await;
    let (two, two_seen) = flaky_backend(2, usize::MAX).await;
    let (three, three_seen) = backend(3).await;
    let deaths = |p| {
        let mut t = table(p, LbPolicy::First, false, 30_000, &[(1, one, Role::Active), (2, two, Role::Warm), (3, three, Role::Active)]);
        for c in t.apps[0].copies.iter_mut().filter(|c| c.copy != 3) {
            c.pid = u32::MAX - 1;
        }
        t
    };
    let rig = start(deaths).await;
    let a = get_path(rig.port, "/crash?x=1", "").await;
    assert_eq!(a.status, 502, "{a:?}");
    assert_eq!((one_seen.load(Ordering::SeqCst), two_seen.load(Ordering::SeqCst)), (1, 1), "it cost two copies");
    // Measured on the real clock: the paused one jumps while real sockets are waited on.
    let t = std::time::Instant::now();
    let again = get_path(rig.port, "/crash?x=1", "").await;
    assert_eq!(again.status, 502, "{again:?}");
    assert!(t.elapsed() < Duration::from_secs(2), "at once: {:?}", t.elapsed());
    assert_eq!(one_seen.load(Ordering::SeqCst) + two_seen.load(Ordering::SeqCst) + three_seen.load(Ordering::SeqCst), 2, "no copy saw it");
    let other = get_path(rig.port, "/crash?x=2", "").await;
    assert_eq!((other.status, other.copy()), (200, 3), "the app keeps answering other requests");
    let refusing = &rig.proxy.traffic()[0].refusing;
    assert_eq!(refusing.len(), 1);
    assert_eq!(refusing[0].request, "GET /crash?x=1");
    tokio::time::sleep(Duration::from_secs(61)).await;
    assert!(rig.proxy.traffic()[0].refusing.is_empty(), "a minute later it is no longer refused");
}

#[tokio::test(start_paused = true)]
async fn a_visitors_forwarded_headers_never_reach_the_copy_and_a_trusted_proxys_do() {
    let one = echo_backend(1).await;
    let rig = start(|p| table(p, LbPolicy::First, false, 30_000, &[(1, one, Role::Active)])).await;
    let spoof = "Forwarded: for=6.6.6.6\r\nX-Real-IP: 6.6.6.6\r\nX-Forwarded-For: 6.6.6.6\r\nX-Forwarded-Host: evil\r\n\
                 X-Forwarded-Port: 1\r\nX-Forwarded-Proto: https\r\nConnection: keep-alive\r\nConnection: X-Secret\r\nX-Secret: 1\r\n";
    let a = get_path(rig.port, "/", spoof).await;
    assert!(!a.body.contains("6.6.6.6") && !a.body.contains("evil") && !a.body.contains("x-secret"), "{}", a.body);
    for line in ["x-forwarded-for: 127.0.0.1", "x-real-ip: 127.0.0.1", "x-forwarded-proto: http"] {
        assert!(a.body.contains(line), "{line} in {}", a.body);
    }
    let mut trusting = table(rig.port, LbPolicy::First, false, 30_000, &[(1, one, Role::Active)]);
    trusting.apps[0].route.trusted_proxies = vec![shinyctl::manifest::Cidr::parse("127.0.0.0/8").unwrap()];
    rig.proxy.push(trusting).await;
    let b = get_path(rig.port, "/", "X-Forwarded-For: 203.0.113.9\r\nX-Forwarded-Proto: https\r\n").await;
    assert!(b.body.contains("x-forwarded-for: 203.0.113.9, 127.0.0.1"), "{}", b.body);
    assert!(b.body.contains("x-forwarded-proto: https"), "{}", b.body);
}

#[tokio::test(start_paused = true)]
async fn past_max_connections_a_visitor_gets_a_plain_503_with_retry_after() {
    let (one, _) = backend(1).await;
    let mut capped = table(0, LbPolicy::First, false, 30_000, &[(1, one, Role::Active)]);
    capped.apps[0].route.max_connections = 2;
    let rig = start(|p| {
        capped.apps[0].route.port = p;
        capped
    })
    .await;
    let idle: Vec<_> = [0, 1].map(|_| std::net::TcpStream::connect(("127.0.0.1", rig.port)).unwrap()).into_iter().collect();
    // Accepted and counted in the load balancer's own time.
    until("the two idle connections to be counted", || rig.proxy.open_connections() == 2).await;
    let over = get(rig.port, None).await;
    assert_eq!(over.status, 503, "{over:?}");
    assert_eq!(over.header("retry-after"), Some("5"), "{over:?}");
    drop(idle);
    until("the two idle connections to be let go", || rig.proxy.open_connections() == 0).await;
    let a = get(rig.port, None).await;
    assert_eq!((a.status, a.copy()), (200, 1), "room again once they closed: {a:?}");
}

#[tokio::test(start_paused = true)]
async fn a_request_body_that_stops_moving_is_cut_after_60_s_not_before() {
    let (one, _frozen, open) = freezable_backend(1).await;
    let rig = start(|p| table(p, LbPolicy::First, false, 30_000, &[(1, one, Role::Active)])).await;
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", rig.port)).await.unwrap();
    s.write_all(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n0123456789").await.unwrap();
    // A slow visitor: ten bytes every 50 s is progress, for minutes.
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_secs(50)).await;
        s.write_all(b"0123456789").await.unwrap();
    }
    assert_eq!(open.load(Ordering::SeqCst), 1, "the copy still has the slow upload after 150 s");
    let t = Instant::now();
    assert!(closed_within(&mut s, Duration::from_secs(75)).await, "a body stalled for 60 s is cut");
    assert!(t.elapsed() >= Duration::from_secs(59), "not before 60 s without a byte: {:?}", t.elapsed());
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(open.load(Ordering::SeqCst), 0, "and the copy's connection is freed");
}

#[tokio::test(start_paused = true)]
async fn slow_headers_and_idle_keep_alive_connections_are_closed() {
    let (one, _) = backend(1).await;
    let rig = start(|p| table(p, LbPolicy::First, false, 30_000, &[(1, one, Role::Active)])).await;
    let mut slow = tokio::net::TcpStream::connect(("127.0.0.1", rig.port)).await.unwrap();
    slow.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nX-A: 1\r\n").await.unwrap();
    let t = Instant::now();
    assert!(closed_within(&mut slow, Duration::from_secs(40)).await, "a head not sent within 30 s closes the connection");
    assert!(t.elapsed() >= Duration::from_secs(29), "{:?}", t.elapsed());

    let mut kept = tokio::net::TcpStream::connect(("127.0.0.1", rig.port)).await.unwrap();
    kept.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n").await.unwrap();
    let t = Instant::now();
    assert!(closed_within(&mut kept, Duration::from_secs(40)).await, "an idle keep-alive connection is closed");
    assert!(t.elapsed() >= Duration::from_secs(29), "{:?}", t.elapsed());
}

#[tokio::test(start_paused = true)]
async fn idle_connections_to_copies_expire() {
    let (one, _frozen, open) = freezable_backend(1).await;
    let rig = start(|p| table(p, LbPolicy::First, false, 30_000, &[(1, one, Role::Active)])).await;
    for _ in 0..3 {
        assert_eq!(get(rig.port, None).await.copy(), 1);
    }
    assert_eq!(open.load(Ordering::SeqCst), 1, "one pooled connection, reused");
    tokio::time::sleep(Duration::from_secs(45)).await;
    assert_eq!(open.load(Ordering::SeqCst), 0, "closed after 30 s idle (swept every 10 s)");
    assert_eq!(get(rig.port, None).await.copy(), 1, "a new one is opened when needed");
}

#[tokio::test(start_paused = true)]
async fn a_stalled_copy_keeps_its_visitors_gets_no_new_ones_and_is_used_again_once_it_answers() {
    let (one, frozen, _) = freezable_backend(1).await;
    let (two, _) = backend(2).await;
    let rig = start(|p| table(p, LbPolicy::First, false, 30_000, &[(1, one, Role::Active), (2, two, Role::Active)])).await;
    let placed = get(rig.port, None).await;
    assert_eq!(placed.copy(), 1);
    let cookie = placed.placed().unwrap();
    let rig_port = rig.port;
    frozen.store(true, Ordering::SeqCst);
    let stuck = tokio::spawn(get(rig.port, None));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!stuck.is_finished(), "the frozen copy holds its request");
    let early = tokio::spawn(get(rig.port, None));
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    // Measured on the real clock: the paused one jumps while real sockets are waited on.
    let t = std::time::Instant::now();
    let a = get(rig.port, None).await;
    assert_eq!((a.status, a.copy()), (200, 2), "past 5 s without an answer, new visitors go elsewhere: {a:?}");
    assert!(t.elapsed() < Duration::from_secs(2), "at once, not waiting on the stalled copy: {:?}", t.elapsed());
    let silent = rig.proxy.traffic()[0].copies.iter().find(|c| c.copy == 1).unwrap().silent_ms;
    assert!((5_000..7_000).contains(&silent), "the daemon learns it: {silent} ms");
    // Its own visitor stays (and waits with it).
    let own = tokio::spawn(async move { get(rig_port, Some(&cookie)).await });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!own.is_finished(), "a placed visitor stays on its copy");
    frozen.store(false, Ordering::SeqCst);
    for h in [stuck, early, own] {
        assert_eq!(h.await.unwrap().copy(), 1, "answered once it runs again");
    }
    // The probe (or those answers) clears it: new visitors come back.
    until("copy 1 to be heard again", || rig.proxy.traffic()[0].copies[0].silent_ms == 0).await;
    assert_eq!(get(rig.port, None).await.copy(), 1, "used again once it answers");
    assert_eq!(rig.proxy.traffic()[0].copies[0].silent_ms, 0);
}

#[tokio::test(start_paused = true)]
async fn when_every_copy_is_stalled_new_visitors_go_to_the_one_that_answered_last() {
    let (one, frozen_one, _) = freezable_backend(1).await;
    let (two, frozen_two, _) = freezable_backend(2).await;
    let rig = start(|p| table(p, LbPolicy::First, false, 30_000, &[(1, one, Role::Active), (2, two, Role::Active)])).await;
    frozen_one.store(true, Ordering::SeqCst);
    let _stuck_one = tokio::spawn(get(rig.port, None));
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(get(rig.port, None).await.copy(), 2, "copy 2 answers");
    frozen_two.store(true, Ordering::SeqCst);
    let _stuck_two = tokio::spawn(get(rig.port, None));
    tokio::time::sleep(Duration::from_secs(6)).await;
    let next = tokio::spawn(get(rig.port, None));
    tokio::time::sleep(Duration::from_millis(100)).await;
    frozen_two.store(false, Ordering::SeqCst);
    assert_eq!(next.await.unwrap().copy(), 2, "both stalled: the one that answered most recently");
}
