//! Sticky sessions.

use super::*;

#[tokio::test(start_paused = true)]
async fn the_sticky_cookie_keeps_a_visitor_on_its_copy() {
    let (one, _) = backend(1).await;
    let (two, _) = backend(2).await;
    let rig = start(|port| table(port, LbPolicy::RoundRobin, false, 30_000, &[(1, one, Role::Active), (2, two, Role::Active)])).await;
    // New visitors alternate, so only the cookie can keep one in place.
    let first = get(rig.port, None).await;
    let second = get(rig.port, None).await;
    assert_ne!(first.copy(), second.copy(), "round-robin places new visitors on both copies");
    let cookie = first.placed().expect("a new visitor is placed");
    assert!(cookie.starts_with(&format!("lb_{}={}.", rig.port, first.copy())), "{cookie}");
    for attr in ["HttpOnly", "SameSite=Lax", "Path=/"] {
        assert!(first.header("set-cookie").unwrap().contains(attr), "{attr} in {first:?}");
    }
    for _ in 0..10 {
        let again = get(rig.port, Some(&cookie)).await;
        assert_eq!(again.copy(), first.copy(), "the visitor stays on its copy");
        assert_eq!(again.placed(), None, "a placed visitor is not placed again");
    }
}

#[tokio::test(start_paused = true)]
async fn a_forged_cookie_is_replaced_by_a_genuine_one() {
    let (one, _) = backend(1).await;
    let (two, _) = backend(2).await;
    let copies = [(1, one, Role::Active), (2, two, Role::Active)];
    let rig = start(|port| table(port, LbPolicy::RoundRobin, false, 30_000, &copies)).await;
    let mut genuine = [get(rig.port, None).await, get(rig.port, None).await];
    genuine.sort_by_key(|a| a.copy());
    let [for_one, for_two] = genuine.map(|a| a.placed().expect("placed"));
    // From now on a new visitor always gets copy 1: a cookie that moves
    // anyone to copy 2 was honoured.
    rig.proxy.push(table(rig.port, LbPolicy::First, false, 30_000, &copies)).await;
    let honoured = get(rig.port, Some(&for_two)).await;
    assert_eq!((honoured.copy(), honoured.placed()), (2, None), "a genuine cookie for copy 2 is honoured");

    let mac_of_one = for_one.split_once('.').unwrap().1;
    let name = format!("lb_{}", rig.port);
    for forged in [
        format!("{name}=2.{mac_of_one}"),
        format!("{name}=2.{}", "0".repeat(64)),
        format!("{name}=2.x"),
        format!("{name}=02.{}", for_two.split_once('.').unwrap().1),
    ] {
        let a = get(rig.port, Some(&forged)).await;
        assert_eq!(a.copy(), 1, "{forged} is not honoured");
        assert_eq!(a.placed().as_deref(), Some(for_one.as_str()), "{forged} is replaced by a genuine cookie");
    }
}
