mod support;
use support::*;
use ticketing::client::Outcome;

#[test]
fn smoke() {
    let mut h = Harness::new(config());
    let a = h.acquire("k", 1000, 5000);
    h.ready(4);
    assert_eq!(h.take_sent(), "A 1 k o 1000 5000\n");
    h.feed("G 1 A k 9 5000 0\n");
    let out = h.take_outcomes();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0, a);
    let Outcome::Granted(g) = &out[0].1 else {
        panic!("{out:?}")
    };
    assert_eq!(g.token(), 9);
    let r = h.client.release(h.now, g).unwrap();
    h.pump();
    assert_eq!(h.take_sent(), "R 2 k 9\n");
    h.feed("D 2 R k\n");
    assert_eq!(h.take_outcomes(), vec![(r, Outcome::Released)]);
    h.client.shutdown(h.now, ms(100)).unwrap();
    h.pump();
    let ev = h.take_events();
    println!("{ev:?}");
    assert!(h.client.is_finished());
}
