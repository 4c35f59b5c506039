//! Writing: reserve room under the lock, copy the parts with no lock held, commit with one
//! store.

use super::layout::*;
use super::Queue;
use crate::error::{CoreError, Result};
use crate::shm::Segment;
use crate::slots::Taken;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// Most messages [`Queue::try_put_many`] reserves under one lock hold.
pub const PUT_BATCH: usize = 64;

/// Where a large message's body goes.
enum SideTo {
    Slot(Taken),
    /// A one-shot segment: its name and length.
    OneShot(String, u64),
}

/// Where a writer may copy its parts.
pub(super) struct Reservation {
    pub pos: u64,
    side: Option<SideTo>,
    /// The writer's token, as stored in the record and the slot.
    me: u32,
    /// Whether cleanups after a failure may wait for the lock (a bounded wait), or only
    /// try it, deferring what they could not do (the caller holds the GIL).
    wait: bool,
}

impl Queue {
    /// Reserves room for one message under the lock (held by party `me`); `None` when it does
    /// not fit yet. `refs`: the parts sent by reference (their table ends the record).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn try_reserve(
        &self,
        h: &Header,
        me: u32,
        seq: u64,
        kind: u32,
        nparts: u32,
        body: u64,
        refs: &[RefEntry],
    ) -> Option<Reservation> {
        if h.n_msgs.load(Ordering::Relaxed) >= h.max_msgs.load(Ordering::Relaxed) {
            self.advance_tail(h);
            if h.n_msgs.load(Ordering::Relaxed) >= h.max_msgs.load(Ordering::Relaxed) {
                return None;
            }
        }
        let inline_need = align_up(REC_BYTES.saturating_add(body), ALIGN);
        let large = inline_need > h.max_inline.load(Ordering::Relaxed);
        let used = h.side_bytes.load(Ordering::Relaxed);
        let within_budget =
            used == 0 || used.saturating_add(body) <= h.side_budget.load(Ordering::Relaxed);
        if large && !within_budget {
            return None;
        }
        let mut side = None;
        if within_budget && body >= h.pool_min.load(Ordering::Relaxed) {
            let written = h.total_bytes.load(Ordering::Relaxed);
            side = h
                .slots
                .take(self.name(), body, me, written)
                .map(SideTo::Slot);
        }
        if side.is_none() && large {
            // Tagged like the queue: it lives by the queue's token, not by its writer.
            side = Some(SideTo::OneShot(
                crate::shm::new_name_like(self.name()).ok()?,
                body,
            ));
        }
        let table = if refs.is_empty() {
            0
        } else {
            refs_bytes(refs.len())
        };
        let need = table
            + match &side {
                None => inline_need,
                Some(SideTo::Slot(_)) => REC_BYTES,
                Some(SideTo::OneShot(name, _)) => align_up(REC_BYTES + name.len() as u64, ALIGN),
            };
        let r = self.ring_size;
        let mut head = h.head.load(Ordering::Relaxed);
        let mut tail = h.tail.load(Ordering::Relaxed);
        let fits = |head: u64, tail: u64| {
            let off = head % r;
            let pad = if off + need > r { r - off } else { 0 };
            head + pad + need - tail <= r
        };
        if !fits(head, tail) {
            // Released records may wait for the tail to pass them (their readers release
            // without the lock).
            self.advance_tail(h);
            tail = h.tail.load(Ordering::Relaxed);
        }
        if head == tail && head % r != 0 {
            // Empty: restart at the ring's start so that any record up to half the ring fits.
            // Three stores; a death between them leaves `tail` ahead, which repair evens out
            // (it is only ever done on an empty ring).
            head = align_up(head, r);
            tail = head;
            h.tail.store(head, Ordering::Relaxed);
            h.read.store(head, Ordering::Relaxed);
            h.head.store(head, Ordering::Relaxed);
        }
        if !fits(head, tail) {
            if let Some(SideTo::Slot(t)) = side {
                h.slots.untake(t);
            }
            return None;
        }
        let off = head % r;
        if off + need > r {
            let p = self.rec(head);
            p.size.store(r - off, Ordering::Relaxed);
            p.flags.store(0, Ordering::Relaxed);
            p.set_state(head, ST_PAD);
            head += r - off;
            h.head.store(head, Ordering::Relaxed);
        }
        let rec = self.rec(head);
        rec.owner.store(me, Ordering::Relaxed);
        rec.set_state(head, ST_WRITING);
        rec.seq.store(seq, Ordering::Relaxed);
        rec.kind.store(kind, Ordering::Relaxed);
        rec.nparts.store(nparts, Ordering::Relaxed);
        rec.size.store(need, Ordering::Relaxed);
        rec.body_len.store(body, Ordering::Relaxed);
        rec.flags.store(0, Ordering::Relaxed);
        match &side {
            None => {}
            Some(SideTo::Slot(t)) => {
                rec.slot.store(t.idx as u32, Ordering::Relaxed);
                rec.slot_gen.store(t.gen, Ordering::Relaxed);
                rec.flags.store(FLAG_SLOT, Ordering::Relaxed);
            }
            Some(SideTo::OneShot(name, _)) => {
                rec.name_len.store(name.len() as u32, Ordering::Relaxed);
                // SAFETY: the record has `need >= 64 + name.len()` bytes reserved for us.
                unsafe {
                    std::ptr::copy_nonoverlapping(name.as_ptr(), self.body_ptr(head), name.len())
                };
                rec.flags.store(FLAG_SIDE, Ordering::Relaxed);
            }
        }
        if !refs.is_empty() {
            // SAFETY: the last `table` bytes of the record's `need` are reserved for us.
            unsafe {
                write_refs(
                    self.body_ptr(head).add((need - table - REC_BYTES) as usize),
                    refs,
                )
            };
            let flags = rec.flags.load(Ordering::Relaxed);
            rec.flags.store(
                flags | FLAG_REFS | ((refs.len() as u32) << REFS_SHIFT),
                Ordering::Relaxed,
            );
        }
        // Publish the reservation: a death before this store leaves nothing reserved. The
        // counters after it are derived and rebuilt by repair if we die here.
        h.head.store(head + need, Ordering::Release);
        // The referenced slots pass to the ring (BUSY(me) -> BUSY(0)): a death before this
        // leaves a WRITING record of a dead writer, whose slots repair discards whichever
        // state each is in (crate::slots, "Sending by reference").
        for r in refs {
            h.slots.hand_to_ring(r.slot as usize, r.gen, me);
        }
        if side.is_some() {
            locked_add(&h.side_bytes, body);
        }
        locked_add(&h.n_msgs, 1);
        locked_add(&h.pending, 1);
        Some(Reservation {
            pos: head,
            side,
            me,
            wait: true,
        })
    }

    /// Writes the parts of a reserved message and commits it (or abandons it on error).
    ///
    /// The commit is a compare-and-swap WRITING -> READY on the record's stamped state word
    /// (`layout::RecordHeader::tag`): if repair judged this process dead meanwhile and
    /// abandoned the record (or its space was since reused), the commit fails and the caller
    /// gets [`CoreError::JudgedDead`]: the message was not put, and nothing lands behind
    /// `read` or in another record.
    pub(super) fn fill_and_commit(&self, res: Reservation, parts: &[&[u8]]) -> Result<()> {
        let rec = self.rec(res.pos);
        let h = self.hdr();
        let me = res.me;
        let judged_dead = || {
            CoreError::JudgedDead(format!(
                "message {} of queue {}",
                rec.seq.load(Ordering::Relaxed),
                self.name()
            ))
        };
        let outcome = match &res.side {
            None => {
                // SAFETY: the record's body was reserved for exactly this layout.
                unsafe { write_body(self.body_ptr(res.pos), parts, false) };
                Ok(())
            }
            Some(SideTo::Slot(t)) => match self.maps.get(self.name(), &self.hdr().slots, *t) {
                Ok(seg) => {
                    let stream = crate::copy::worth_streaming(body_len(parts), t.since_filled);
                    // SAFETY: the slot's segment holds at least `body_len(parts)` bytes
                    // (checked by SlotMaps::get) and is ours (BUSY, holder us) until commit.
                    unsafe { write_body(seg.as_ptr(), parts, stream) };
                    // BUSY(me) -> BUSY(0), only if repair did not take it from us.
                    if h.slots.hand_to_ring(t.idx, t.gen, me) {
                        Ok(())
                    } else {
                        Err(judged_dead())
                    }
                }
                Err(e) => {
                    self.discard_slots(vec![(t.idx, t.gen)], res.wait);
                    Err(e)
                }
            },
            Some(SideTo::OneShot(name, len)) => {
                Segment::create_named(name, *len as usize).map(|seg| {
                    // A new segment: the kernel zeroed it just now (0 bytes since filled).
                    let stream = crate::copy::worth_streaming(*len, 0);
                    // SAFETY: the new segment has `len = body_len(parts)` bytes, ours alone.
                    unsafe { write_body(seg.as_ptr(), parts, stream) };
                    // The reader attaches by name; our handle must not unlink it on drop.
                    seg.forget_name();
                })
            }
        };
        if outcome.is_err() && refs_count(rec) > 0 && rec.stamped(res.pos) {
            // Abandoned: the slots it sends by reference go with it (a slot repair already
            // discarded has another generation or none: discarding it again does nothing).
            let slots = self
                .refs_of(res.pos, rec)
                .iter()
                .map(|r| (r.slot as usize, r.gen))
                .collect();
            self.discard_slots(slots, res.wait);
        }
        let to = if outcome.is_ok() {
            ST_READY
        } else {
            ST_ABANDONED
        };
        let outcome = if rec.change(res.pos, ST_WRITING, to) {
            outcome
        } else {
            // Repair abandoned the record: this process was judged dead. Whatever it made
            // for the message is nobody's now; the name of a one-shot segment it may have
            // created after repair unlinked it goes too.
            match &res.side {
                Some(SideTo::OneShot(name, _)) => {
                    let _ = crate::shm::unlink_name(name);
                }
                Some(SideTo::Slot(t)) => {
                    // Repair emptied the slot (and unlinked its name); a fresh slot's
                    // segment may have been made after that. Its generation is never
                    // handed out again, so the name is ours alone.
                    let _ = crate::shm::unlink_name(&crate::slots::slot_name(
                        self.name(),
                        h.slots.name_key(),
                        t.idx,
                        t.gen,
                    ));
                }
                None => {}
            }
            Err(outcome.err().unwrap_or_else(judged_dead))
        };
        self.wake_readers(1);
        outcome
    }

    /// Puts one message; blocks until there is room or `deadline` passes (`None`: forever;
    /// a deadline already past: do not block).
    pub fn put(
        &self,
        seq: u64,
        kind: u32,
        parts: &[&[u8]],
        deadline: Option<Instant>,
    ) -> Result<()> {
        self.put_many(&[(seq, kind, parts)], deadline).map(|_| ())
    }

    /// Puts messages in order, reserving as many as fit under one lock. Returns how many were
    /// put: all of them, unless the deadline passed (then `Err(Full)` if none was put).
    /// Errors other than `Full` after some were put are returned as `Partial`, so that a
    /// caller knows how many went in and never puts them twice.
    pub fn put_many(
        &self,
        msgs: &[(u64, u32, &[&[u8]])],
        deadline: Option<Instant>,
    ) -> Result<usize> {
        let h = self.hdr();
        let mut done = 0;
        while done < msgs.len() {
            let seen = h.space_seq.0.load(Ordering::SeqCst);
            let n = match self.put_some(&msgs[done..], deadline) {
                Ok(n) => n,
                Err(CoreError::Busy { .. }) if deadline.map_or(true, |d| Instant::now() < d) => 0,
                Err(CoreError::Busy { .. }) => break,
                Err(e) if done == 0 => return Err(e),
                Err(e) => return Err(CoreError::partial(done, e)),
            };
            done += n;
            if n > 0 {
                continue;
            }
            if !self.wait_for_space(seen, deadline) {
                break;
            }
        }
        if done == 0 && !msgs.is_empty() {
            return Err(CoreError::Full);
        }
        Ok(done)
    }

    /// Puts the first messages that fit now (up to [`PUT_BATCH`] under one lock hold), never
    /// waiting for room, and only *trying* the lock (`Err(Busy)` if it is held): for callers
    /// that hold the GIL. Returns how many were put.
    pub fn try_put_many(&self, msgs: &[(u64, u32, &[&[u8]])]) -> Result<usize> {
        let g = self.try_lock()?;
        self.put_locked(g, msgs, false)
    }

    /// As [`Queue::try_put_many`], but waits for the lock until `deadline`.
    fn put_some(&self, msgs: &[(u64, u32, &[&[u8]])], deadline: Option<Instant>) -> Result<usize> {
        let g = self.lock_until(deadline)?;
        self.put_locked(g, msgs, true)
    }

    /// Reserves the first messages that fit under the lock `g`, releases it, then fills and
    /// commits them. Returns how many.
    fn put_locked(
        &self,
        g: crate::shmlock::ShmLockGuard<'_>,
        msgs: &[(u64, u32, &[&[u8]])],
        wait: bool,
    ) -> Result<usize> {
        let h = self.hdr();
        let me = self.party()?;
        // The one-message call allocates nothing.
        let mut one = [None];
        let mut many = Vec::new();
        let batch: &mut [Option<Reservation>] = if msgs.len() == 1 {
            &mut one
        } else {
            many.resize_with(msgs.len().min(PUT_BATCH), || None);
            &mut many
        };
        let (mut n, mut bytes) = (0, 0);
        {
            let _g = g;
            // Checked once per batch: a close racing the batch lets it through whole (readers
            // drain it), as if it had come just before; never half a batch left reserved.
            if h.closed.load(Ordering::SeqCst) != 0 {
                return Err(CoreError::Closed);
            }
            for (slot, (seq, kind, parts)) in batch.iter_mut().zip(msgs) {
                let (np, body) = (parts.len() as u32, body_len(parts));
                match self.try_reserve(h, me, *seq, *kind, np, body, &[]) {
                    Some(r) => *slot = Some(Reservation { wait, ..r }),
                    None => break,
                }
                n += 1;
                bytes += parts.iter().map(|p| p.len() as u64).sum::<u64>();
            }
            locked_add(&h.total_puts.0, n as u64);
            locked_add(&h.total_bytes, bytes);
        }
        // Messages commit in order; after a failure the rest of the batch is given up, so
        // that an error says exactly how many went in (the first `ok`), never more.
        let mut first_err = None;
        let mut ok = 0;
        for (r, m) in batch.iter_mut().zip(msgs).take(n) {
            let r = r.take().expect("reserved above");
            if first_err.is_some() {
                self.give_up(r);
                continue;
            }
            match self.fill_and_commit(r, m.2) {
                Ok(()) => ok += 1,
                Err(e) => first_err = Some(e),
            }
        }
        match first_err {
            Some(e) if ok == 0 => Err(e),
            Some(e) => Err(CoreError::partial(ok, e)),
            None => Ok(n),
        }
    }

    /// Gives up a reserved message unfilled: its record is abandoned and its slot discarded
    /// (a batch stopped at an earlier message's failure).
    fn give_up(&self, res: Reservation) {
        let rec = self.rec(res.pos);
        if rec.stamped(res.pos) && rec.state() == ST_WRITING {
            let mut slots: Vec<(usize, u64)> = self
                .refs_of(res.pos, rec)
                .iter()
                .map(|r| (r.slot as usize, r.gen))
                .collect();
            if let Some(SideTo::Slot(t)) = &res.side {
                slots.push((t.idx, t.gen));
            }
            self.discard_slots(slots, res.wait);
        }
        rec.change(res.pos, ST_WRITING, ST_ABANDONED);
        self.wake_readers(1);
    }
}
