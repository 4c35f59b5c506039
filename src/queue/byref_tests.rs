//! Unit tests of sending by reference: leased slots, their hand-over, and what repair does
//! when a writer dies at each step.

use super::layout::*;
use super::*;
use crate::slots::slot_size;

fn queue() -> Queue {
    Queue::create(&QueueConfig {
        ring_bytes: 1 << 16,
        max_messages: 1 << 10,
        max_inline: None,
        side_budget: None,
        pool_bytes: Some(8 << 20),
        pool_min: None,
    })
    .unwrap()
}

fn soon() -> Option<Instant> {
    Some(Instant::now() + Duration::from_secs(5))
}

/// Leases `len` bytes, fills them with `fill`, and returns the slot and its ref entry.
fn leased(q: &Queue, len: u64, fill: u8) -> (WriterSlot, RefEntry) {
    let w = q.lease_slot(len, soon()).unwrap().expect("a slot");
    // SAFETY: the slot's mapping has at least `len` bytes and is ours (BUSY(us)).
    unsafe { std::ptr::write_bytes(w.seg.as_ptr(), fill, len as usize) };
    let (idx, gen) = w.lease.slot();
    let e = RefEntry {
        part: 1,
        slot: idx as u32,
        gen,
        offset: 0,
        len,
    };
    (w, e)
}

#[test]
fn a_leased_slot_travels_by_reference_and_returns_to_the_pool() {
    let q = queue();
    let len = 1 << 20;
    let (w, e) = leased(&q, len, 7);
    q.put_refs(5, 3, &[b"head", &[]], &[e], soon()).unwrap();
    w.lease.disarm();
    let mut c = q.claim(1, soon()).unwrap();
    assert_eq!(c[0].seq, 5);
    assert_eq!(c[0].refs.len(), 1);
    let (part, buf, off, n) = &c[0].refs[0];
    assert_eq!((*part, *off, *n), (1, 0, len));
    // The reader sees the writer's pages themselves.
    assert_eq!(buf.as_ptr(), w.seg.as_ptr());
    // SAFETY: the claim holds the slot; `len` bytes lie inside it.
    let bytes = unsafe { std::slice::from_raw_parts(buf.as_ptr(), len as usize) };
    assert!(bytes.iter().all(|&b| b == 7));
    let head = unsafe { std::slice::from_raw_parts(q.part_ptr(&c[0], 0), 4) };
    assert_eq!(head, b"head");
    q.release(&mut c);
    drop(c);
    q.audit(soon()).unwrap();
    // Free again: the next lease of that size reuses the same segment.
    let (w2, e2) = leased(&q, len, 1);
    assert_eq!((e2.slot, e2.gen), (e.slot, e.gen));
    drop(w2);
    assert_eq!(q.pool_bytes().0, slot_size(len));
}

#[test]
fn an_unsent_lease_goes_back_to_the_pool_when_dropped() {
    let q = queue();
    let (w, e) = leased(&q, 300_000, 1);
    drop(w);
    let (_w2, e2) = leased(&q, 300_000, 2);
    assert_eq!((e2.slot, e2.gen), (e.slot, e.gen));
}

#[test]
fn a_lease_sent_once_cannot_be_sent_again() {
    let q = queue();
    let (w, e) = leased(&q, 300_000, 1);
    q.put_refs(1, 0, &[b"x", &[]], &[e], soon()).unwrap();
    w.lease.disarm();
    let again = q.put_refs(2, 0, &[b"x", &[]], &[e], soon());
    assert!(matches!(again, Err(CoreError::Invalid(_))), "{again:?}");
}

#[test]
fn the_pool_refuses_a_lease_it_has_no_room_for() {
    let q = queue();
    let (_a, _) = leased(&q, 5 << 20, 1);
    assert!(q.lease_slot(5 << 20, soon()).unwrap().is_none());
}

#[test]
fn a_dead_writers_lease_is_discarded_by_repair() {
    let q = queue();
    let (w, e) = leased(&q, 1 << 20, 1);
    let ghost = q.hdr().parties.register_ghost();
    q.hdr().slots.set_holder(e.slot as usize, ghost);
    w.lease.disarm();
    assert!(q.recover() >= 1);
    assert_eq!(q.pool_bytes().0, 0);
    q.audit(soon()).unwrap();
}

#[test]
fn a_writer_dead_after_publishing_its_record_loses_it_and_its_slots() {
    let q = queue();
    let h = q.hdr();
    let len = 1 << 20;
    {
        let _g = q.lock_until(None).unwrap();
        let ghost = h.parties.register_ghost();
        let t = h.slots.take(q.name(), len, ghost, 0).unwrap();
        let e = RefEntry {
            part: 1,
            slot: t.idx as u32,
            gen: t.gen,
            offset: 0,
            len,
        };
        // Reserved and handed over (the slot is BUSY(0)), never committed.
        let r = q.try_reserve(h, ghost, 1, 0, 2, 64, &[e]).unwrap();
        assert_eq!(q.refs_of(r.pos, q.rec(r.pos)), vec![e]);
    }
    q.put(2, 0, &[b"ok"], None).unwrap();
    let mut c = q.claim(1, soon()).unwrap();
    assert_eq!(c[0].seq, 2);
    q.release(&mut c);
    assert_eq!(
        q.pool_bytes().0,
        0,
        "the abandoned record's slot is discarded"
    );
    q.audit(soon()).unwrap();
}

#[test]
fn a_reader_dead_mid_claim_gives_the_referenced_slots_back() {
    let q = queue();
    let (w, e) = leased(&q, 1 << 20, 9);
    q.put_refs(1, 0, &[b"x", &[]], &[e], soon()).unwrap();
    w.lease.disarm();
    {
        // A reader that claimed it and died before storing `read`.
        let _g = q.lock_until(None).unwrap();
        let h = q.hdr();
        let ghost = h.parties.register_ghost();
        let pos = h.read.load(Ordering::Relaxed);
        let rec = q.rec(pos);
        rec.owner.store(ghost, Ordering::Relaxed);
        rec.set_state(pos, ST_READING);
        h.slots.hand_to(e.slot as usize, e.gen, ghost);
    }
    q.recover();
    let mut c = q.claim(1, soon()).unwrap();
    assert_eq!(c[0].refs.len(), 1);
    // SAFETY: the claim holds the slot.
    assert_eq!(unsafe { *c[0].refs[0].1.as_ptr() }, 9);
    q.release(&mut c);
}

#[test]
fn a_discard_that_cannot_wait_for_the_lock_is_done_at_the_next_hold() {
    // A failed write whose caller holds the GIL only tries the lock to discard its slot;
    // held by someone else, the discard waits for this handle's next hold of the lock.
    let q = queue();
    let w = q.lease_slot(1 << 20, soon()).unwrap().unwrap();
    let (idx, gen) = w.lease.slot();
    w.lease.disarm();
    q.hdr().lock.0.force_holder(q.party().unwrap());
    q.discard_slots(vec![(idx, gen)], false); // must not wait
    assert!(q.hdr().slots.holds(idx, gen), "discarded without the lock");
    q.hdr().lock.0.force_holder(0);
    q.put(1, 0, &[b"x"], soon()).unwrap();
    assert!(
        !q.hdr().slots.holds(idx, gen),
        "the deferred discard was not done"
    );
    assert_eq!(q.pool_bytes().0, 0);
}
