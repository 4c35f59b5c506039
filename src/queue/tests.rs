//! The queue's unit tests (one process, threads, and forked children that die on purpose).

use super::layout::*;
use super::read::slot_of;
use super::*;
use crate::error::{CoreError, Result};
use std::collections::HashMap;
use std::thread;

fn small(ring: u64) -> Queue {
    Queue::create(&QueueConfig {
        ring_bytes: ring,
        max_messages: 1 << 20,
        max_inline: None,
        side_budget: None,
        pool_bytes: None,
        pool_min: None,
    })
    .unwrap()
}

/// Gets one message and returns (seq, kind, parts as owned vectors).
fn get(q: &Queue, deadline: Option<Instant>) -> Result<(u64, u32, Vec<Vec<u8>>)> {
    let mut c = q.claim(1, deadline)?;
    let m = &c[0];
    let parts = (0..m.parts.len())
        .map(|i| {
            let len = m.parts[i].1 as usize;
            // SAFETY: the claim is held; the part lies inside its body.
            unsafe { std::slice::from_raw_parts(q.part_ptr(m, i), len).to_vec() }
        })
        .collect();
    let out = (m.seq, m.kind, parts);
    q.release(&mut c);
    Ok(out)
}

fn payload(producer: u64, i: u64) -> Vec<u8> {
    let len = ((producer * 31 + i * 17) % 300) as usize;
    (0..len).map(|k| (k as u64 ^ i ^ producer) as u8).collect()
}

#[test]
fn round_trip_keeps_parts_and_tags() {
    let q = small(1 << 16);
    q.put(7, 3, &[b"pickle", b"", &[9u8; 100]], None).unwrap();
    let (seq, kind, parts) = get(&q, None).unwrap();
    assert_eq!((seq, kind), (7, 3));
    assert_eq!(parts, vec![b"pickle".to_vec(), vec![], vec![9u8; 100]]);
    assert!(q.is_empty());
}

#[test]
fn zero_parts_and_zero_length_messages() {
    let q = small(4096);
    for i in 0..1000 {
        q.put(i, 0, &[], None).unwrap();
        let (seq, _, parts) = get(&q, None).unwrap();
        assert_eq!(seq, i);
        assert!(parts.is_empty());
    }
}

#[test]
fn wraps_around_many_times_with_odd_sizes() {
    let q = small(8192);
    for i in 0..20_000u64 {
        let p = payload(1, i);
        q.put(i, 1, &[&p], None).unwrap();
        if i % 3 == 2 {
            for j in i - 2..=i {
                let (seq, _, parts) = get(&q, None).unwrap();
                assert_eq!(seq, j);
                assert_eq!(parts[0], payload(1, j));
            }
        }
    }
}

#[test]
fn oversized_messages_use_side_segments() {
    let q = small(8192);
    let big: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
    q.put(1, 0, &[b"hdr", &big], None).unwrap();
    q.put(2, 0, &[b"x"], None).unwrap();
    let mut c = q.claim(2, None).unwrap();
    assert!(c[0].side.is_some());
    assert!(c[1].side.is_none());
    let len = c[0].parts[1].1 as usize;
    // SAFETY: claim held.
    let got = unsafe { std::slice::from_raw_parts(q.part_ptr(&c[0], 1), len) };
    assert_eq!(got, &big[..]);
    let side = c[0].side.clone().unwrap();
    q.release(&mut c);
    // The side segment was unlinked at claim: nobody else can attach any more.
    assert!(Segment::attach(side.name()).is_err());
}

#[test]
fn waited_counts_the_waits_for_room_and_messages_not_the_copies() {
    let q = small(8192);
    let big = vec![7u8; 8 << 20];
    q.put(1, 0, &[&big], None).unwrap(); // room at once: its copy is no wait
    assert_eq!(get(&q, None).unwrap().0, 1);
    assert_eq!(q.waited(), Duration::ZERO);
    let soon = Instant::now() + Duration::from_millis(20);
    assert!(matches!(get(&q, Some(soon)), Err(CoreError::Empty)));
    let after_get = q.waited();
    assert!(after_get > Duration::ZERO, "the empty queue was waited on");
    // A full ring: the put waits for room until its deadline.
    while q.put(0, 0, &[&[1u8; 1000]], Some(Instant::now())).is_ok() {}
    let soon = Instant::now() + Duration::from_millis(20);
    assert!(matches!(
        q.put(9, 0, &[b"x"], Some(soon)),
        Err(CoreError::Full)
    ));
    assert!(q.waited() > after_get, "the full ring was waited on");
}

/// A queue with a 64 KiB ring (16 KiB inline at most) and a pool of `pool` bytes.
fn pooled(pool: Option<u64>) -> Queue {
    Queue::create(&QueueConfig {
        ring_bytes: 1 << 16,
        max_messages: 1 << 10,
        max_inline: None,
        side_budget: None,
        pool_bytes: pool,
        pool_min: None,
    })
    .unwrap()
}

fn big(len: usize, salt: u8) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8 ^ salt).collect()
}

/// Claims one large message, checks its content, returns it with its side segment's name.
fn claim_big(q: &Queue, want: &[u8]) -> (Vec<Claimed>, String) {
    let c = q.claim(1, None).unwrap();
    let len = c[0].parts[1].1 as usize;
    // SAFETY: the claim is held.
    let got = unsafe { std::slice::from_raw_parts(q.part_ptr(&c[0], 1), len) };
    assert_eq!(got, want);
    let name = c[0].side.as_ref().unwrap().name().to_owned();
    (c, name)
}

#[test]
fn large_messages_reuse_pooled_segments() {
    let q = pooled(None);
    let a = big(40_000, 1);
    q.put(1, 0, &[b"hdr", &a], None).unwrap();
    let (mut c, first) = claim_big(&q, &a);
    assert!(c[0].side.as_ref().unwrap().pooled());
    q.release(&mut c);
    drop(c);
    let kept = q.pool_bytes().0;
    assert!(kept >= 40_000, "{kept}");
    for salt in 2..20 {
        let b = big(40_000 - salt as usize, salt);
        q.put(salt as u64, 0, &[b"hdr", &b], None).unwrap();
        let (mut c, name) = claim_big(&q, &b);
        assert_eq!(name, first, "the free segment is reused");
        q.release(&mut c);
    }
    assert_eq!(q.pool_bytes().0, kept);
}

#[test]
fn a_slot_says_how_much_the_queue_wrote_since_it_was_last_filled() {
    // What chooses streaming stores for a copy (crate::copy): a fresh segment counts as
    // just filled; a reused one, by the queue's bytes put since its last take.
    let q = pooled(Some(8 << 20));
    let h = q.hdr();
    let me = q.party().unwrap();
    let _g = q.lock_until(None).unwrap();
    let t = h.slots.take(q.name(), 1 << 20, me, 5 << 20).unwrap();
    assert!(t.fresh);
    assert_eq!(t.since_filled, 0);
    h.slots.give_back(t.idx, t.gen, me);
    let again = h.slots.take(q.name(), 1 << 20, me, 25 << 20).unwrap();
    assert_eq!((again.idx, again.fresh), (t.idx, false));
    assert_eq!(again.since_filled, 20 << 20);
    h.slots.give_back(again.idx, again.gen, me);
    let soon_after = h.slots.take(q.name(), 1 << 20, me, 26 << 20).unwrap();
    assert_eq!(soon_after.since_filled, 1 << 20);
    assert!(!crate::copy::worth_streaming(
        1 << 20,
        soon_after.since_filled
    ));
    assert!(crate::copy::worth_streaming(1 << 20, again.since_filled));
    h.slots.give_back(soon_after.idx, soon_after.gen, me);
}

#[test]
fn bodies_copied_by_streaming_stores_arrive_whole() {
    // A body of COLD_AFTER bytes or more streams whatever its slot; parts of odd lengths
    // put the second part at an offset the streamed copy must align itself.
    let q = pooled(Some(64 << 20));
    let head = big(1001, 7);
    let body = big(crate::copy::COLD_AFTER as usize + 5, 3);
    for round in 0..3u64 {
        q.put(round, 0, &[&head, &body], None).unwrap();
        let mut c = q.claim(1, None).unwrap();
        assert!(c[0].side.as_ref().unwrap().pooled());
        for (k, want) in [(0, &head), (1, &body)] {
            let len = c[0].parts[k].1 as usize;
            // SAFETY: the claim is held.
            let got = unsafe { std::slice::from_raw_parts(q.part_ptr(&c[0], k), len) };
            assert_eq!(got, &want[..], "part {k} of message {round}");
        }
        q.release(&mut c);
    }
}

#[test]
fn a_held_view_keeps_its_slot() {
    let q = pooled(None);
    let a = big(30_000, 1);
    q.put(1, 0, &[b"hdr", &a], None).unwrap();
    let (mut ca, name_a) = claim_big(&q, &a);
    q.release(&mut ca);
    let view_a = ca[0].side.clone().unwrap();
    let off = ca[0].parts[1].0 as usize;
    drop(ca);
    let b = big(30_000, 2);
    q.put(2, 0, &[b"hdr", &b], None).unwrap();
    let (mut cb, name_b) = claim_big(&q, &b);
    q.release(&mut cb);
    drop(cb);
    assert_ne!(name_a, name_b, "a slot in use is not written over");
    // SAFETY: the view keeps the mapping alive; the body starts at `off`.
    let still = unsafe { std::slice::from_raw_parts(view_a.as_ptr().add(off), a.len()) };
    assert_eq!(still, &a[..]);
    drop(view_a);
    let c = big(30_000, 3);
    q.put(3, 0, &[b"hdr", &c], None).unwrap();
    let (_cc, name_c) = claim_big(&q, &c);
    assert!(name_c == name_a || name_c == name_b);
}

#[test]
fn the_pool_stays_under_its_cap() {
    // No pool: every large message gets a one-shot segment.
    let q = pooled(Some(0));
    let a = big(30_000, 1);
    q.put(1, 0, &[b"hdr", &a], None).unwrap();
    let (mut c, _) = claim_big(&q, &a);
    assert!(!c[0].side.as_ref().unwrap().pooled());
    q.release(&mut c);
    assert_eq!(q.pool_bytes(), (0, 0));
    // Room for two 40 KB segments: views held on three messages make the third one-shot.
    let q = pooled(Some(100_000));
    let mut held = Vec::new();
    for salt in 0..3u8 {
        let b = big(40_000, salt);
        q.put(salt as u64, 0, &[b"hdr", &b], None).unwrap();
        let (mut c, _) = claim_big(&q, &b);
        q.release(&mut c);
        held.push(c[0].side.clone().unwrap());
    }
    let pooled_now: Vec<bool> = held.iter().map(|s| s.pooled()).collect();
    assert_eq!(pooled_now, vec![true, true, false]);
    assert!(q.pool_bytes().0 <= 100_000);
}

#[test]
fn mid_sized_messages_lease_a_slot_or_go_inline() {
    let q = |pool: u64| {
        Queue::create(&QueueConfig {
            ring_bytes: 1 << 20,
            max_messages: 1 << 10,
            max_inline: None,
            side_budget: None,
            pool_bytes: Some(pool),
            pool_min: Some(8 << 10),
        })
        .unwrap()
    };
    let a = big(20_000, 1);
    let small = b"tiny".to_vec();
    // Above pool_min: a slot (zero-copy); below: inline.
    let pooled_q = q(1 << 20);
    pooled_q.put(1, 0, &[b"hdr", &a], None).unwrap();
    pooled_q.put(2, 0, &[b"hdr", &small], None).unwrap();
    let (mut c, _) = claim_big(&pooled_q, &a);
    assert!(c[0].side.as_ref().unwrap().pooled());
    pooled_q.release(&mut c);
    let mut c = pooled_q.claim(1, None).unwrap();
    assert!(c[0].side.is_none());
    pooled_q.release(&mut c);
    // No pool: a message that fits inline goes inline, never to a one-shot segment.
    let inline_q = q(0);
    inline_q.put(1, 0, &[b"hdr", &a], None).unwrap();
    let mut c = inline_q.claim(1, None).unwrap();
    assert!(c[0].side.is_none());
    let len = c[0].parts[1].1 as usize;
    // SAFETY: the claim is held.
    let got = unsafe { std::slice::from_raw_parts(inline_q.part_ptr(&c[0], 1), len) };
    assert_eq!(got, &a[..]);
    inline_q.release(&mut c);
}

#[test]
fn a_larger_message_evicts_a_free_smaller_segment() {
    let q = pooled(Some(150_000));
    let a = big(40_000, 1);
    q.put(1, 0, &[b"hdr", &a], None).unwrap();
    let (mut c, small_name) = claim_big(&q, &a);
    q.release(&mut c);
    drop(c);
    let b = big(120_000, 2);
    q.put(2, 0, &[b"hdr", &b], None).unwrap();
    let (mut c, big_name) = claim_big(&q, &b);
    assert!(c[0].side.as_ref().unwrap().pooled());
    q.release(&mut c);
    assert_ne!(small_name, big_name);
    assert!(
        Segment::attach(&small_name).is_err(),
        "evicted segments are unlinked"
    );
    drop(c);
    // ... and no longer mapped by this process (its slot cache kept every evicted one).
    for (idx, gen) in q.maps.cached() {
        assert!(
            q.hdr().slots.holds(idx, gen) || q.hdr().slots.free_gen(idx) == Some(gen),
            "slot {idx} generation {gen} was evicted but stays mapped"
        );
    }
    let (kept, cap) = q.pool_bytes();
    assert!(kept >= 120_000 && kept <= cap, "{kept} {cap}");
}

#[test]
fn a_slot_held_by_a_dead_reader_is_recovered() {
    let q = pooled(None);
    let a = big(30_000, 1);
    q.put(1, 0, &[b"hdr", &a], None).unwrap();
    let (mut c, name) = claim_big(&q, &a);
    q.release(&mut c);
    // Pretend the reader died while its views lived.
    let idx = slot_of(q.rec(c[0].pos)).0;
    let ghost = q.hdr().parties.register_ghost();
    q.hdr().slots.set_holder(idx, ghost);
    assert!(q.recover() >= 1);
    assert_eq!(q.pool_bytes().0, 0);
    assert!(Segment::attach(&name).is_err());
    // Our (stale) lease does not free a slot that is no longer ours.
    drop(c);
    assert_eq!(q.pool_bytes().0, 0);
}

#[test]
fn dropping_the_owner_unlinks_pooled_segments() {
    let q = pooled(None);
    let other = Queue::attach(q.name()).unwrap();
    let a = big(30_000, 1);
    other.put(1, 0, &[b"hdr", &a], None).unwrap();
    let (mut c, name) = claim_big(&q, &a);
    q.release(&mut c);
    drop(c);
    drop(other);
    assert!(
        Segment::attach(&name).is_ok(),
        "kept for reuse while the queue lives"
    );
    // A view that outlives the queue keeps its memory, not the names.
    q.put(2, 0, &[b"hdr", &a], None).unwrap();
    let (mut c, _) = claim_big(&q, &a);
    q.release(&mut c);
    let view = c[0].side.clone().unwrap();
    let off = c[0].parts[1].0 as usize;
    drop(c);
    let qname = q.name().to_owned();
    drop(q);
    assert!(Segment::attach(&name).is_err());
    assert!(Segment::attach(&qname).is_err());
    // SAFETY: the view keeps the mapping alive; the part starts at `off`.
    let still = unsafe { std::slice::from_raw_parts(view.as_ptr().add(off), a.len()) };
    assert_eq!(still, &a[..]);
}

#[test]
fn bounded_in_messages_and_nonblocking_calls() {
    let q = Queue::create(&QueueConfig {
        ring_bytes: 1 << 16,
        max_messages: 3,
        max_inline: None,
        side_budget: None,
        pool_bytes: None,
        pool_min: None,
    })
    .unwrap();
    let now = Some(Instant::now());
    for i in 0..3 {
        q.put(i, 0, &[b"a"], now).unwrap();
    }
    assert!(matches!(q.put(3, 0, &[b"a"], now), Err(CoreError::Full)));
    assert_eq!(q.len(), 3);
    get(&q, now).unwrap();
    q.put(3, 0, &[b"a"], now).unwrap();
    for _ in 0..3 {
        get(&q, now).unwrap();
    }
    assert!(matches!(get(&q, now), Err(CoreError::Empty)));
}

#[test]
fn bounded_in_bytes() {
    let q = small(4096);
    let chunk = vec![1u8; 900];
    let now = Some(Instant::now());
    let mut n = 0;
    while q.put(n, 0, &[&chunk], now).is_ok() {
        n += 1;
        assert!(n < 10, "ring of 4 KiB took more than 4 KiB");
    }
    assert!(n >= 2);
}

#[test]
fn close_wakes_blocked_readers_and_writers() {
    let q = Arc::new(small(4096));
    let r = {
        let q = q.clone();
        thread::spawn(move || get(&q, None).map(|_| ()))
    };
    let full = Arc::new(
        Queue::create(&QueueConfig {
            ring_bytes: 4096,
            max_messages: 1,
            max_inline: None,
            side_budget: None,
            pool_bytes: None,
            pool_min: None,
        })
        .unwrap(),
    );
    full.put(0, 0, &[], None).unwrap();
    let w = {
        let full = full.clone();
        thread::spawn(move || full.put(1, 0, &[], None))
    };
    thread::sleep(Duration::from_millis(50));
    q.close(None);
    full.close(None);
    assert!(matches!(r.join().unwrap(), Err(CoreError::Closed)));
    assert!(matches!(w.join().unwrap(), Err(CoreError::Closed)));
    // Closed queues still hand out what they hold, then report Closed.
    assert_eq!(get(&full, None).unwrap().0, 0);
    assert!(matches!(get(&full, None), Err(CoreError::Closed)));
}

#[test]
fn a_close_racing_batched_puts_loses_nothing_and_hangs_no_reader() {
    for round in 0..20u64 {
        let q = Arc::new(small(1 << 16));
        let writers: Vec<_> = (0..2)
            .map(|w| {
                let q = q.clone();
                thread::spawn(move || {
                    let body = [7u8; 40];
                    let parts: [&[u8]; 1] = [&body];
                    let batch: Vec<(u64, u32, &[&[u8]])> =
                        (0..16).map(|i| (i, w, &parts[..])).collect();
                    let mut put = 0;
                    loop {
                        match q.try_put_many(&batch) {
                            Ok(n) => put += n,
                            Err(CoreError::Closed) => return put,
                            // Only tries the lock: another thread holds it now. Let the
                            // reader have it (it sleeps on the lock; spinning here could
                            // starve it on a busy machine).
                            Err(CoreError::Busy { .. }) => thread::yield_now(),
                            Err(e) => panic!("{e}"),
                        }
                    }
                })
            })
            .collect();
        let reader = {
            let q = q.clone();
            thread::spawn(move || {
                let mut got = 0;
                // A record left reserved by the close would stall this until the deadline.
                let deadline = || Some(Instant::now() + Duration::from_secs(10));
                loop {
                    match q.claim(32, deadline()) {
                        Ok(mut c) => {
                            got += c.len();
                            q.release(&mut c);
                        }
                        Err(CoreError::Closed) => return got,
                        Err(e) => panic!("reader: {e}"),
                    }
                }
            })
        };
        // Close while batches are going in (after the first ones landed).
        let until = Instant::now() + Duration::from_secs(10);
        while q.totals().0 == 0 && Instant::now() < until {
            thread::yield_now();
        }
        thread::sleep(Duration::from_millis(round % 5));
        q.close(None);
        let put: usize = writers.into_iter().map(|w| w.join().unwrap()).sum();
        assert!(put > 0);
        assert_eq!(reader.join().unwrap(), put, "round {round}");
    }
}

#[test]
fn stress_many_writers_many_readers_no_loss_no_dup_fifo_per_writer() {
    const WRITERS: u64 = 4;
    const READERS: usize = 3;
    const PER: u64 = 20_000;
    let q = Arc::new(small(1 << 15));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let q = q.clone();
            thread::spawn(move || {
                let mut i = 0;
                while i < PER {
                    // Alternate single puts and batches.
                    if i % 5 == 0 && i + 4 <= PER {
                        let ps: Vec<Vec<u8>> = (i..i + 4).map(|k| payload(w, k)).collect();
                        let parts: Vec<[&[u8]; 1]> = ps.iter().map(|p| [&p[..]]).collect();
                        let msgs: Vec<(u64, u32, &[&[u8]])> = (0..4)
                            .map(|k| ((w << 32) | (i + k as u64), w as u32, &parts[k][..]))
                            .collect();
                        assert_eq!(q.put_many(&msgs, None).unwrap(), 4);
                        i += 4;
                    } else {
                        let p = payload(w, i);
                        q.put((w << 32) | i, w as u32, &[&p], None).unwrap();
                        i += 1;
                    }
                }
            })
        })
        .collect();
    let readers: Vec<_> = (0..READERS)
        .map(|_| {
            let q = q.clone();
            thread::spawn(move || {
                let mut seen: HashMap<u64, Vec<u64>> = HashMap::new();
                loop {
                    let mut c = match q.claim(16, None) {
                        Ok(c) => c,
                        Err(CoreError::Closed) => break,
                        Err(e) => panic!("{e}"),
                    };
                    for m in &c {
                        let w = m.seq >> 32;
                        let i = m.seq & 0xffff_ffff;
                        assert_eq!(m.kind as u64, w);
                        let len = m.parts[0].1 as usize;
                        // SAFETY: claim held.
                        let got = unsafe { std::slice::from_raw_parts(q.part_ptr(m, 0), len) };
                        assert_eq!(got, &payload(w, i)[..], "payload of {w}/{i}");
                        seen.entry(w).or_default().push(i);
                    }
                    q.release(&mut c);
                }
                seen
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    q.close(None);
    let mut all: HashMap<u64, Vec<u64>> = HashMap::new();
    for r in readers {
        for (w, v) in r.join().unwrap() {
            // Each reader claims in FIFO order, so its share of one writer is increasing.
            assert!(
                v.windows(2).all(|p| p[0] < p[1]),
                "FIFO broken for writer {w}"
            );
            all.entry(w).or_default().extend(v);
        }
    }
    for w in 0..WRITERS {
        let mut v = all.remove(&w).unwrap();
        v.sort_unstable();
        assert_eq!(
            v,
            (0..PER).collect::<Vec<_>>(),
            "loss or duplicate for writer {w}"
        );
    }
}

#[test]
fn record_of_a_dead_writer_is_abandoned_and_skipped() {
    let q = small(1 << 14);
    let h = q.hdr();
    {
        let _g = q.lock_until(None).unwrap();
        let ghost = h.parties.register_ghost();
        // Pretend a process that no longer exists is writing it.
        let r = q.try_reserve(h, ghost, 1, 0, 0, 0, &[]).unwrap();
        assert_eq!(q.rec(r.pos).owner.load(Ordering::Relaxed), ghost);
    }
    q.put(2, 0, &[b"ok"], None).unwrap();
    // The reader would wait behind the dead record; recovery lets it through.
    let (seq, _, _) = get(&q, Some(Instant::now() + Duration::from_secs(5))).unwrap();
    assert_eq!(seq, 2);
}

/// Gets one small message the way Python's `get` does: [`Queue::take_small`], waiting on
/// the data stamp when the queue is empty.
fn take_one(q: &Queue, deadline: Option<Instant>) -> Result<(u64, u32, Vec<Vec<u8>>)> {
    let copy = |seq, kind, parts: &[&[u8]]| {
        Ok::<_, ()>((seq, kind, parts.iter().map(|p| p.to_vec()).collect()))
    };
    loop {
        let stamp = q.data_stamp();
        match q.take_small(1 << 10, copy)? {
            Small::Took(m) => return Ok(m.unwrap()),
            Small::NotSmall => panic!("expected a small message"),
            // Held by someone (perhaps dead): the slow way waits, takes over, repairs.
            Small::Busy => return get(q, deadline),
            Small::Empty => {
                if q.wait_readable(stamp, deadline) == Waited::TimedOut {
                    return Err(CoreError::Empty);
                }
            }
        }
    }
}

#[test]
fn an_empty_queue_takes_any_record_that_fits_at_once() {
    let q = small(4096);
    for size in [8usize, 600, 8, 900, 100, 1000] {
        // Drained: a record of any size up to the inline limit fits without waiting.
        q.put(size as u64, 0, &[&vec![1u8; size]], Some(Instant::now()))
            .unwrap_or_else(|e| panic!("{size} B into an empty queue: {e}"));
        assert_eq!(get(&q, None).unwrap().2[0].len(), size);
    }
}

#[test]
fn take_small_copies_and_releases_under_one_lock() {
    let q = small(4096);
    // Many times round the ring: each take frees its record's space at once.
    for i in 0..2000u64 {
        let p = payload(1, i);
        q.put(i, 3, &[b"head", &p], None).unwrap();
        let (seq, kind, parts) = take_one(&q, None).unwrap();
        assert_eq!((seq, kind), (i, 3));
        assert_eq!(parts, vec![b"head".to_vec(), p]);
    }
    assert_eq!(q.len(), 0);
    assert!(matches!(
        q.take_small(64, |_, _, _| Ok::<_, ()>(())),
        Ok(Small::Empty)
    ));
    // Zero parts, and an empty part.
    q.put(1, 0, &[], None).unwrap();
    q.put(2, 0, &[b""], None).unwrap();
    assert_eq!(take_one(&q, None).unwrap().2, Vec::<Vec<u8>>::new());
    assert_eq!(take_one(&q, None).unwrap().2, vec![Vec::<u8>::new()]);
    q.close(None);
    assert!(matches!(take_one(&q, None), Err(CoreError::Closed)));
}

#[test]
fn take_small_leaves_large_and_many_part_messages_to_claim() {
    let q = small(1 << 16);
    let big = vec![7u8; 3000];
    let five: [&[u8]; 5] = [b"a", b"b", b"c", b"d", b"e"];
    q.put(1, 0, &[&big], None).unwrap();
    q.put(2, 0, &five, None).unwrap();
    q.put(3, 0, &[b"x"], None).unwrap();
    for want in [1, 2] {
        assert!(matches!(
            q.take_small(1 << 10, |_, _, _| Ok::<_, ()>(())),
            Ok(Small::NotSmall)
        ));
        assert_eq!(get(&q, None).unwrap().0, want);
    }
    assert_eq!(take_one(&q, None).unwrap(), (3, 0, vec![b"x".to_vec()]));
}

#[test]
fn a_reader_killed_inside_take_small_loses_nothing_and_blocks_nothing() {
    let _forks = crate::testing::forking();
    let q = small(1 << 14);
    q.put(1, 0, &[b"not lost with its reader"], None).unwrap();
    q.put(2, 0, &[b"next"], None).unwrap();
    // SAFETY: the child only touches the queue's shared memory and leaves with _exit, so
    // it runs no destructor or test-harness code inherited from this process.
    let child = unsafe { libc::fork() };
    assert!(child >= 0, "fork failed");
    if child == 0 {
        // Dies holding the queue lock, its record marked READING.
        let _ = q.take_small(1 << 10, |_, _, _| -> std::result::Result<(), ()> {
            unsafe { libc::_exit(0) }
        });
        unsafe { libc::_exit(1) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child; `status` is a valid out-pointer.
    assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
    let holder = q.hdr().lock.0.holder();
    assert_eq!(
        q.hdr().parties.identity(holder).map(|id| id.pid),
        Some(child as u32),
        "died holding the lock"
    );
    let first = q.rec(q.hdr().read.load(Ordering::Relaxed));
    assert_eq!(first.state(), ST_READING);
    // The lock is taken over; the dead reader never returned its message, so it is given
    // back and delivered, then the rest flows.
    let deadline = Some(Instant::now() + Duration::from_secs(10));
    let (seq, _, parts) = take_one(&q, deadline).unwrap();
    assert_eq!(
        (seq, parts),
        (1, vec![b"not lost with its reader".to_vec()])
    );
    let (seq, _, parts) = take_one(&q, deadline).unwrap();
    assert_eq!((seq, parts), (2, vec![b"next".to_vec()]));
    q.put(3, 0, &[b"after"], None).unwrap();
    assert_eq!(take_one(&q, deadline).unwrap().0, 3);
    assert_eq!(q.len(), 0);
    q.audit(deadline).unwrap();
}

#[test]
fn lock_held_by_a_dead_process_is_taken_over() {
    let q = small(4096);
    let ghost = q.hdr().parties.register_ghost();
    q.hdr().lock.0.force_holder(ghost);
    q.put(1, 0, &[], None).unwrap();
    assert_eq!(get(&q, None).unwrap().0, 1);
}

#[test]
fn attach_checks_the_layout() {
    let q = small(4096);
    let other = Queue::attach(q.name()).unwrap();
    other.put(5, 1, &[b"hi"], None).unwrap();
    assert_eq!(get(&q, None).unwrap().2[0], b"hi");
    let seg = Segment::create(8192, crate::liveness::me().unwrap()).unwrap();
    assert!(matches!(
        Queue::attach(seg.name()),
        Err(CoreError::BadSegment(_))
    ));
}

/// A party that does not exist (its token was never made): dead to everyone.
fn ghost(q: &Queue, salt: u32) -> u32 {
    let me = crate::liveness::me().unwrap();
    let id = crate::liveness::Identity {
        pid: me.pid,
        nonce: me.nonce ^ salt,
    };
    q.hdr().parties.register(id).unwrap().token
}

#[test]
fn a_claim_cut_short_by_death_is_given_back() {
    let q = small(1 << 14);
    for i in 0..3 {
        q.put(i, 0, &[b"m"], None).unwrap();
    }
    let h = q.hdr();
    let g = ghost(&q, 0x1111_1111);
    // What a reader leaves when it dies inside `claim` before storing `read`: two records
    // READING, `pending` already lowered, the lock held.
    let mut pos = h.read.load(Ordering::Relaxed);
    for _ in 0..2 {
        let rec = q.rec(pos);
        rec.owner.store(g, Ordering::Relaxed);
        rec.set_state(pos, ST_READING);
        pos += rec.size.load(Ordering::Relaxed);
    }
    locked_sub(&h.pending, 2);
    h.lock.0.force_holder(g);
    let deadline = Some(Instant::now() + Duration::from_secs(10));
    let got: Vec<u64> = (0..3).map(|_| get(&q, deadline).unwrap().0).collect();
    assert_eq!(got, vec![0, 1, 2], "nothing lost, order kept");
    q.audit(deadline).unwrap();
}

#[test]
fn an_interrupted_restart_of_an_empty_ring_is_evened_out() {
    let q = small(4096);
    q.put(1, 0, &[&[5u8; 100]], None).unwrap();
    get(&q, None).unwrap();
    let h = q.hdr();
    let at = h.head.load(Ordering::Relaxed);
    assert!(at % q.ring_size() != 0);
    // The restart stores tail, read, head in turn; the writer died after the first.
    h.tail.store(align_up(at, q.ring_size()), Ordering::Relaxed);
    let g = ghost(&q, 0x2222_2222);
    h.lock.0.force_holder(g);
    let deadline = Some(Instant::now() + Duration::from_secs(10));
    q.put(2, 0, &[&[6u8; 1000]], deadline).unwrap();
    assert_eq!(get(&q, deadline).unwrap().0, 2);
    q.audit(deadline).unwrap();
}

#[test]
fn counters_a_dead_holder_left_wrong_are_rebuilt() {
    let q = small(1 << 14);
    q.put(1, 0, &[b"x"], None).unwrap();
    get(&q, None).unwrap();
    let h = q.hdr();
    // A counter wrapped by a death between two stores.
    h.pending.store(u64::MAX, Ordering::Relaxed);
    h.n_msgs.store(u64::MAX, Ordering::Relaxed);
    let g = ghost(&q, 0x3333_3333);
    h.lock.0.force_holder(g);
    let deadline = Some(Instant::now() + Duration::from_secs(10));
    // `put` into an empty queue must not report Full for ever.
    q.put(2, 0, &[b"y"], deadline).unwrap();
    assert_eq!(get(&q, deadline).unwrap().0, 2);
    q.close(deadline);
    // A closed, drained queue reports Closed (it waited for ever before).
    assert!(matches!(get(&q, deadline), Err(CoreError::Closed)));
    q.audit(deadline).unwrap();
}

#[test]
fn a_full_party_table_adopts_a_dead_entry() {
    let q = small(1 << 14);
    for k in 0..parties::PARTIES as u32 {
        ghost(&q, 0x4000_0000 | k);
    }
    let deadline = Some(Instant::now() + Duration::from_secs(10));
    // Every entry is taken by a dead party; this process still gets in, and a record a
    // ghost left WRITING is given up rather than waited on.
    let h = q.hdr();
    {
        let g1 = h.lock.0.try_lock(1).unwrap();
        let r = q.try_reserve(h, 1, 9, 0, 0, 0, &[]).unwrap();
        assert_eq!(q.rec(r.pos).owner.load(Ordering::Relaxed), 1);
        drop(g1);
    }
    q.put(1, 0, &[b"in"], deadline).unwrap();
    assert_eq!(get(&q, deadline).unwrap().0, 1);
    q.audit(deadline).unwrap();
}

#[test]
fn the_creators_death_closes_the_queue_for_its_waiters() {
    let q = small(1 << 14);
    q.put(1, 0, &[b"left"], None).unwrap();
    // A creator that does not exist (its token was never made) reads as dead.
    let me = crate::liveness::me().unwrap();
    let dead = crate::liveness::Identity {
        pid: me.pid,
        nonce: me.nonce ^ 0x3333_3333,
    };
    q.hdr().owner.store(dead.packed(), Ordering::Relaxed);
    let deadline = Some(Instant::now() + Duration::from_secs(20));
    assert_eq!(
        get(&q, deadline).unwrap().0,
        1,
        "what was queued is still delivered"
    );
    // Before, this waited out its deadline (and a wait with none, for ever).
    assert!(matches!(get(&q, deadline), Err(CoreError::Closed)));
    assert!(q.is_closed());
    assert!(matches!(
        q.put(2, 0, &[b"x"], deadline),
        Err(CoreError::Closed)
    ));
}

/// What a writer judged dead while alive does: it reserved its record (as a party whose
/// liveness cannot be proven: a token with no liveness file behind it), then stalled while
/// copying; another party repairs meanwhile. Returns the reservation it resumes with.
fn reserve_as_judged_dead(q: &Queue, parts: &[&[u8]], seq: u64) -> write::Reservation {
    let h = q.hdr();
    let writer = h.parties.register_ghost();
    let _g = q.lock_until(None).unwrap();
    let np = parts.len() as u32;
    q.try_reserve(h, writer, seq, 0, np, body_len(parts), &[])
        .unwrap()
}

#[test]
fn a_late_commit_of_a_writer_judged_dead_is_refused_and_nothing_acknowledged_is_lost() {
    let q = small(1 << 14);
    let d = Some(Instant::now() + Duration::from_secs(20));
    q.put(1, 0, &[b"before"], None).unwrap();
    let res = reserve_as_judged_dead(&q, &[b"late"], 2);
    q.put(3, 0, &[b"after"], None).unwrap();
    // A reader's repair judges the writer dead and gives its record up; reads pass it.
    assert!(q.recover() >= 1);
    assert_eq!(get(&q, d).unwrap().0, 1);
    assert_eq!(get(&q, d).unwrap().0, 3);
    // The writer resumes: its commit is refused (it used to land READY behind `read`).
    let e = q.fill_and_commit(res, &[b"late"]).unwrap_err();
    assert!(matches!(e, CoreError::JudgedDead(_)), "{e}");
    assert!(e.to_string().contains("was not put"), "{e}");
    q.audit(d).unwrap();
    // Nothing is pinned: the ring wraps many times over the old record's space.
    for i in 0..1000u64 {
        q.put(10 + i, 0, &[&[7u8; 300]], d).unwrap();
        assert_eq!(get(&q, d).unwrap().0, 10 + i);
    }
    q.audit(d).unwrap();
}

#[test]
fn a_late_commit_racing_the_reuse_of_its_space_touches_no_other_record() {
    let q = small(4096);
    let d = Some(Instant::now() + Duration::from_secs(20));
    let res = reserve_as_judged_dead(&q, &[b"late"], 1);
    assert!(q.recover() >= 1);
    // The ring goes round until a new record sits where the abandoned one was.
    let mut n = 0;
    while !(q.rec(res.pos).stamped(res.pos + q.ring_size()) && q.rec(res.pos).state() == ST_READY) {
        assert!(n < 100_000, "the ring never came back round");
        q.put(100 + n, 0, &[b"m"], d).unwrap();
        if q.rec(res.pos).stamped(res.pos + q.ring_size()) {
            break;
        }
        assert_eq!(get(&q, d).unwrap().0, 100 + n);
        n += 1;
    }
    // The new record there is READY and unread: the late commit must leave it alone.
    assert!(matches!(
        q.fill_and_commit(res, &[b"late"]),
        Err(CoreError::JudgedDead(_))
    ));
    assert_eq!(get(&q, d).unwrap().0, 100 + n);
    q.audit(d).unwrap();
}

#[test]
fn a_late_commit_into_a_slot_repair_took_is_refused_and_leaves_no_name() {
    let q = pooled(None);
    let d = Some(Instant::now() + Duration::from_secs(20));
    let a = big(30_000, 3);
    let res = reserve_as_judged_dead(&q, &[b"hdr", &a], 1);
    let (idx, gen) = slot_of(q.rec(res.pos));
    assert!(q.rec(res.pos).flags.load(Ordering::Relaxed) & FLAG_SLOT != 0);
    assert!(q.recover() >= 1);
    assert!(matches!(
        q.fill_and_commit(res, &[b"hdr", &a]),
        Err(CoreError::JudgedDead(_))
    ));
    let name = crate::slots::slot_name(q.name(), q.hdr().slots.name_key(), idx, gen);
    assert!(Segment::attach(&name).is_err(), "{name} was left behind");
    q.put(2, 0, &[b"hdr", &a], d).unwrap();
    let (mut c, _) = claim_big(&q, &a);
    q.release(&mut c);
    q.audit(d).unwrap();
}

#[test]
fn audit_reports_a_ready_record_behind_read_and_repair_unpins_it() {
    let q = small(1 << 14);
    let d = Some(Instant::now() + Duration::from_secs(20));
    for i in 1..=3 {
        q.put(i, 0, &[b"m"], None).unwrap();
    }
    let h = q.hdr();
    // Message 1 stays claimed, so the tail cannot pass message 2 once it is read.
    let mut held = q.claim(1, d).unwrap();
    let second = h.read.load(Ordering::Relaxed);
    assert_eq!(get(&q, d).unwrap().0, 2);
    // A READY record behind `read` (what a late commit used to leave): `audit` passed it,
    // and the tail stopped at it for ever.
    q.rec(second).set_state(second, ST_READY);
    let e = q.audit(d).unwrap_err();
    assert!(e.to_string().contains("behind read"), "{e}");
    q.release(&mut held);
    assert_eq!(h.tail.load(Ordering::Relaxed), second, "pinned");
    let ghost = h.parties.register_ghost();
    h.lock.0.force_holder(ghost);
    q.put(4, 0, &[b"c"], d).unwrap(); // takes the lock over, repairs
    q.audit(d).unwrap();
    assert_eq!(get(&q, d).unwrap().0, 3);
    assert_eq!(get(&q, d).unwrap().0, 4);
    for i in 0..500u64 {
        q.put(10 + i, 0, &[&[1u8; 200]], d).unwrap();
        assert_eq!(get(&q, d).unwrap().0, 10 + i);
    }
    q.audit(d).unwrap();
}

#[test]
fn take_small_whose_callback_fails_leaves_the_message_first() {
    let q = small(1 << 14);
    q.put(1, 0, &[b"kept"], None).unwrap();
    q.put(2, 0, &[b"next"], None).unwrap();
    let r = q.take_small(1 << 10, |_, _, _| Err::<(), _>("out of memory"));
    assert!(matches!(r, Ok(Small::Took(Err("out of memory")))));
    assert_eq!(q.len(), 2);
    let d = Some(Instant::now() + Duration::from_secs(10));
    assert_eq!(take_one(&q, d).unwrap(), (1, 0, vec![b"kept".to_vec()]));
    assert_eq!(take_one(&q, d).unwrap().0, 2);
    q.audit(d).unwrap();
}

#[test]
fn a_stale_token_is_dead_even_when_its_number_is_registered_again() {
    let q = small(1 << 14);
    let h = q.hdr();
    let old = h.parties.register_ghost();
    // Repair frees the dead entry, and a new registration takes the same number.
    q.recover();
    let me = crate::liveness::me().unwrap();
    let id = crate::liveness::Identity {
        pid: me.pid,
        nonce: me.nonce ^ 0x0505_0505,
    };
    let new = h.parties.register(id).unwrap().token;
    assert_eq!(parties::split(new).0, parties::split(old).0, "same number");
    assert_ne!(new, old, "a new generation");
    assert!(h.parties.identity(old).is_none());
    assert_eq!(h.parties.identity(new), Some(id));
}

#[test]
fn a_death_inside_evict_loses_no_later_message() {
    // Evicting a free slot takes two steps (mark it EMPTY, unlink its segment's name). A
    // death between them must not leave a FREE slot whose name is gone: the next large
    // message would go into it, and a reader mapping it by name would lose it.
    let q = pooled(Some(150_000));
    let reader = Queue::attach(q.name()).unwrap();
    let d = Some(Instant::now() + Duration::from_secs(10));
    let a = big(40_000, 1);
    q.put(1, 0, &[b"hdr", &a], None).unwrap();
    let (mut c, _) = claim_big(&q, &a);
    q.release(&mut c);
    drop(c);
    // A larger message evicts the free one; the writer dies inside the eviction.
    crate::slots::DIE_IN_EVICT.with(|x| x.set(true));
    let b = big(120_000, 2);
    let died = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = q.put(2, 0, &[b"hdr", &b], d);
    }));
    assert!(died.is_err());
    q.recover();
    // The next message of the evicted slot's size goes through, read by another handle
    // (which maps slots by name).
    q.put(3, 0, &[b"hdr", &a], d).unwrap();
    let (mut c, _) = claim_big(&reader, &a);
    assert_eq!(c[0].seq, 3);
    reader.release(&mut c);
    q.audit(d).unwrap();
}

#[test]
fn positions_more_than_a_ring_apart_are_an_error_and_repair_cuts_them_back() {
    let q = small(4096);
    let d = Some(Instant::now() + Duration::from_secs(10));
    q.put(1, 0, &[b"a"], None).unwrap();
    let h = q.hdr();
    let head = h.head.load(Ordering::Relaxed);
    h.head.store(head + 1000 * q.ring_size(), Ordering::Relaxed);
    assert!(q.audit(d).is_err());
    assert!(matches!(q.claim(1, d), Err(CoreError::BadSegment(_))));
    q.recover();
    assert!(h.head.load(Ordering::Relaxed) - h.tail.load(Ordering::Relaxed) <= q.ring_size());
    q.audit(d).unwrap();
    // The queue goes on.
    while let Ok(c) = q.claim(8, Some(Instant::now())) {
        let mut c = c;
        q.release(&mut c);
    }
    q.put(2, 0, &[b"b"], d).unwrap();
    assert_eq!(get(&q, d).unwrap().0, 2);
}

#[test]
fn many_idle_waiters_scan_for_the_dead_once_a_tick_between_them() {
    // Every waiter whose sleep ended without progress scanned every party's token: hundreds
    // of idle pool workers did so hundreds of times a tick. The scans are now shared.
    let q = Arc::new(small(1 << 14));
    q.party().unwrap();
    let start = Instant::now();
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let q = q.clone();
            thread::spawn(move || {
                let d = Instant::now() + Duration::from_millis(400);
                while Instant::now() < d {
                    q.wait_readable(q.data_stamp(), Some(d));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let scans = q.scans.load(Ordering::Relaxed);
    let ticks = (start.elapsed().as_nanos() / RECOVER_TICK.as_nanos()) as u64;
    assert!(
        scans <= ticks + 1,
        "{scans} scans in {ticks} ticks by 8 waiters of one queue"
    );
    assert!(scans >= 1, "nobody scanned");
}

#[test]
fn a_waiter_whose_spins_never_catch_anything_stops_spinning_and_still_gets_its_message() {
    // Waits that time out with nothing sent: each spin ends in a sleep.
    let q = small(1 << 16);
    for _ in 0..3 {
        let d = Some(Instant::now() + Duration::from_millis(5));
        assert!(matches!(q.claim(1, d), Err(CoreError::Empty)));
    }
    assert!(
        q.spin_policy[0].misses() >= crate::spin::MISS_LIMIT,
        "the reader's missed spins were not counted"
    );
    assert_eq!(q.spin_policy[1].misses(), 0, "the writers' side is its own");
    // A waiter that sleeps at once is still woken by the next message.
    let q = Arc::new(q);
    let reader = {
        let q = q.clone();
        thread::spawn(move || get(&q, Some(Instant::now() + Duration::from_secs(60))))
    };
    thread::sleep(Duration::from_millis(20));
    q.put(7, 0, &[b"x"], None).unwrap();
    assert_eq!(reader.join().unwrap().unwrap().0, 7);
}

#[test]
fn a_spin_counts_as_caught_only_if_the_look_after_it_found_a_message() {
    let mut q = small(1 << 16);
    let base = Duration::from_micros(20);
    q.set_spin(base);
    let long = Duration::from_micros(60);
    // An idle reader whose spins see commits that another reader takes: misses, nothing
    // learned, so it stops spinning like any reader whose spins never catch.
    for _ in 0..crate::spin::MISS_LIMIT {
        q.settle_read_spin(Waited::Caught(long), false);
    }
    assert_eq!(q.spin_policy[0].misses(), crate::spin::MISS_LIMIT);
    assert_eq!(
        q.spin_policy[0].budget(base),
        base,
        "a catch of nothing was learned"
    );
    // A catch that found its message: spinning is on again, and its length learned.
    q.settle_read_spin(Waited::Caught(long), true);
    assert_eq!(q.spin_policy[0].misses(), 0);
    assert_eq!(q.spin_policy[0].budget(base), 2 * long);
    // Waits that did not spin settle nothing.
    q.settle_read_spin(Waited::Woke, false);
    q.settle_read_spin(Waited::TimedOut, false);
    assert_eq!(q.spin_policy[0].misses(), 0);
    assert_eq!(q.spin_policy[0].budget(base), 2 * long);

    // Through a claim: the writer sends while the reader spins (a spin long enough to
    // outlast the writer's pause), and the reader gets its message. Which way its wait
    // ended depends on the machine's load, so each outcome is checked for what it teaches:
    // a catch (no miss, a length learned), a spin that was descheduled (one miss, nothing
    // learned), or a reader that came after the message (nothing at all).
    let q = Arc::new(small(1 << 16));
    let mut q2 = Queue::attach(q.name()).unwrap();
    q2.set_spin(Duration::from_secs(5));
    let q2 = Arc::new(q2);
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = {
        let q2 = q2.clone();
        thread::spawn(move || {
            tx.send(()).unwrap();
            get(&q2, Some(Instant::now() + Duration::from_secs(60)))
        })
    };
    rx.recv().unwrap();
    thread::sleep(Duration::from_millis(2));
    q.put(3, 0, &[b"x"], None).unwrap();
    assert_eq!(reader.join().unwrap().unwrap().0, 3);
    let misses = q2.spin_policy[0].misses();
    let learned = q2.spin_policy[0].budget(Duration::ZERO);
    assert!(misses <= 1, "{misses} misses for one wait");
    if misses == 1 {
        assert_eq!(learned, Duration::ZERO, "a descheduled spin was learned");
    }
    assert!(learned <= crate::spin::SPIN_CAP);
}

#[test]
#[cfg(target_os = "linux")]
fn a_commit_wakes_the_reader_that_fell_asleep_last_and_another_when_it_is_gone() {
    let q = Arc::new(small(1 << 14));
    let h = q.hdr();
    // A reader asleep in a claim names its party as the last to fall asleep, and takes the
    // name back when it wakes.
    let me = parties::split(q.party().unwrap()).0;
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = {
        let (q, tx) = (q.clone(), tx.clone());
        thread::spawn(move || {
            // SAFETY: gettid takes no arguments and cannot fail.
            tx.send(unsafe { libc::gettid() }).unwrap();
            get(&q, Some(Instant::now() + Duration::from_secs(60)))
        })
    };
    let tid = rx.recv().unwrap();
    crate::wait::until_asleep(tid, || h.last_reader.load(Ordering::SeqCst) == me);
    q.put(1, 0, &[b"one"], None).unwrap();
    assert_eq!(reader.join().unwrap().unwrap().0, 1);
    assert_eq!(h.last_reader.load(Ordering::SeqCst), 0);

    // Two sleepers of other parties (5, then 6, the last): a commit wakes 6 alone; the next,
    // whose chosen sleeper is gone, wakes 5.
    let seen = q.data_stamp();
    let sleeper = |party: u32| {
        let (q, tx) = (q.clone(), tx.clone());
        thread::spawn(move || {
            // SAFETY: as above.
            tx.send(unsafe { libc::gettid() }).unwrap();
            let word = &q.hdr().data_seq.0;
            crate::wait::wait_tagged(word, seen, Some(Duration::from_secs(60)), reader_tag(party));
        })
    };
    h.readers_waiting.fetch_add(2, Ordering::SeqCst);
    let five = sleeper(5);
    crate::wait::until_asleep(rx.recv().unwrap(), || true);
    let six = sleeper(6);
    crate::wait::until_asleep(rx.recv().unwrap(), || true);
    h.last_reader.store(6, Ordering::SeqCst);
    q.put(2, 0, &[b"two"], None).unwrap();
    six.join().unwrap();
    assert!(
        !five.is_finished(),
        "the commit woke a reader other than the last asleep"
    );
    q.put(3, 0, &[b"three"], None).unwrap();
    five.join().unwrap();
    h.readers_waiting.fetch_sub(2, Ordering::SeqCst);
    let d = Some(Instant::now() + Duration::from_secs(10));
    assert_eq!((get(&q, d).unwrap().0, get(&q, d).unwrap().0), (2, 3));
    q.audit(d).unwrap();
}

#[test]
fn a_queue_dropped_while_a_forking_child_copies_its_hold_goes_once_the_copy_does() {
    use crate::late_leaves::tests::{retried_until_gone, token_exists};
    use std::os::fd::{FromRawFd, OwnedFd};
    let q = small(1 << 16);
    let tag = q.token.as_ref().unwrap().tag();
    // The copy a child holds between fork and exec (the same open file description).
    // SAFETY: dup of a descriptor the queue's token owns; `copy` owns the new one.
    let copy = unsafe { OwnedFd::from_raw_fd(libc::dup(q.token.as_ref().unwrap().raw_fd())) };
    drop(q);
    let other = small(1 << 16); // retries the leave: still held
    assert!(token_exists(tag), "removed while a copy still held it");
    drop(copy); // the child execs: its copy closes without a look
    drop(other); // retries it again
    assert!(
        retried_until_gone(tag),
        "the token stayed after the copy went"
    );
}
