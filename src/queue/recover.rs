//! The crash model: what a process that dies (or stops) between any two steps leaves behind,
//! and how the survivors mend it. `repair` runs under the lock, whenever the lock was taken
//! over from a dead holder and whenever a waiter's sleep ends without progress (`recover`).
//!
//! | who dies, where | what it leaves | what repair does |
//! | --- | --- | --- |
//! | anyone, holding the lock | the lock word names a dead party; any prefix of an update | the next locker takes the lock over (liveness token), then repairs all below |
//! | a writer, in `try_reserve` before `head` is published | a half-made record beyond `head` | nothing to do: it is not in the ring |
//! | a writer, after `head` moved, before the counters | counters one short | counters are rebuilt from the records |
//! | a writer, on an empty ring's restart (3 stores) | `tail` (or `read`) ahead of `head` | positions evened out: `read = max(read, tail)`, `head = max(head, read)` |
//! | a writer, copying (record WRITING) | a record that never commits | marked ABANDONED; its one-shot segment unlinked, its slot discarded |
//! | a writer, sending by reference, before `head` moved | slots BUSY(dead writer), not in the ring | discarded (dead holder) |
//! | a writer, sending by reference, after `head` moved | a WRITING record whose table names slots BUSY(0) or BUSY(dead) | marked ABANDONED; every slot its table names discarded |
//! | a writer, holding a leased slot it has not sent | a slot BUSY with a dead holder | slot discarded, its segment unlinked |
//! | a reader, in `claim` before `read` is stored | records READING at or after `read` | given back as READY (nobody received them) |
//! | a reader, in `take_small`'s copy | its record READING at `read` | given back as READY |
//! | a reader, after its claim (record READING before `read`) | a message delivered to a dead process | marked ABANDONED (the reader had it) |
//! | a reader, holding views of a pooled slot | a slot BUSY with a dead holder | slot discarded, its segment unlinked |
//! | anyone, in `slots.take`/`evict` | a slot half-changed, `pool_bytes` off | EMPTY slots zeroed, `pool_bytes` rebuilt |
//! | a waiter, asleep | its sleeping count raised | counts rebuilt from the live parties |
//! | a releaser, before the tail moved | DONE records before `read` | the next lock holder advances the tail |
//! | the queue's creator, anywhere | a queue whose names stay while any party holds the queue's token (`liveness::QueueToken`), then go with the last party or the next sweep | a waiter that finds it dead closes the queue (`close_if_owner_died`): gets drain what is left, then fail `Closed`; puts fail |
//!
//! After the records, slots and counts that named them are mended, the dead parties' entries
//! are freed. A stopped process is alive: nothing it holds is taken from it; waiters time out
//! instead, and go on once it is killed or resumes.

use super::layout::*;
use super::read::slot_of;
use super::Queue;
use crate::error::{CoreError, Result};
use std::sync::atomic::Ordering;
use std::time::Instant;

/// What a walk over the ring finds: the counters as the records say they should be.
#[derive(Debug, Default, PartialEq, Eq)]
struct Derived {
    n_msgs: u64,
    pending: u64,
    side_bytes: u64,
}

impl Queue {
    /// Repairs the queue if any party died: takes the lock (waiting at most a recovery tick)
    /// and mends what dead processes left. Returns how many records and slots were recovered.
    /// Waiters call this on their own whenever a sleep ends without progress.
    pub fn recover(&self) -> usize {
        let deadline = Some(Instant::now() + super::RECOVER_TICK);
        match self.lock_until(deadline) {
            Ok(_g) => self.repair(self.hdr(), None),
            Err(_) => 0,
        }
    }

    /// Under the lock: mends everything dead parties left (see the table above), and what
    /// the dead former owner of `adopted` left (this process just adopted its number).
    pub(super) fn repair(&self, h: &Header, adopted: Option<u32>) -> usize {
        let dead_entries = h.parties.dead();
        let mut dead: Vec<u32> = dead_entries.iter().map(|&(p, _)| p).collect();
        dead.extend(adopted);
        // Positions: a restart of an empty ring may have stopped after one or two stores.
        let tail = h.tail.load(Ordering::Relaxed);
        let read = h.read.load(Ordering::Relaxed).max(tail);
        let head = h.head.load(Ordering::Relaxed).max(read);
        h.read.store(read, Ordering::Relaxed);
        h.head.store(head, Ordering::Relaxed);
        let mut found = 0;
        let mut pos = tail;
        while pos < head {
            let rec = self.rec(pos);
            if !self.sane(pos, rec, head) {
                // A record we cannot follow: the ring past it is lost. Cut it off so that the
                // queue goes on (this needs a corrupted segment, not a crash).
                h.head.store(pos, Ordering::Relaxed);
                h.read.store(read.min(pos), Ordering::Relaxed);
                break;
            }
            let st = rec.state.load(Ordering::Acquire);
            let owner = rec.owner.load(Ordering::Relaxed);
            let owner_dead = dead.contains(&owner) || h.parties.identity(owner).is_none();
            if st == ST_READING && pos >= read {
                // A claim that never completed: nobody received it.
                rec.state.store(ST_READY, Ordering::Release);
                if rec.flags.load(Ordering::Relaxed) & FLAG_SLOT != 0 {
                    let (idx, gen) = slot_of(rec);
                    h.slots.hand_to(idx, gen, 0);
                }
                for r in self.refs_of(pos, rec) {
                    h.slots.hand_to(r.slot as usize, r.gen, 0);
                }
                found += 1;
            } else if (st == ST_WRITING || st == ST_READING) && owner_dead {
                let flags = rec.flags.load(Ordering::Relaxed);
                if flags & FLAG_SIDE != 0 {
                    let _ = crate::shm::unlink_name(&self.side_name(pos, rec));
                } else if flags & FLAG_SLOT != 0 && st == ST_WRITING {
                    // Half written: the slot's content is garbage (a dead reader's slot goes
                    // with the slot repair below, by its holder).
                    let (idx, gen) = slot_of(rec);
                    h.slots.discard(self.name(), idx, gen);
                }
                if st == ST_WRITING {
                    // Its slots sent by reference: BUSY(0) or still BUSY(dead writer).
                    self.discard_refs(pos, rec);
                }
                rec.state.store(ST_ABANDONED, Ordering::Release);
                found += 1;
            }
            pos += rec.size.load(Ordering::Relaxed);
        }
        found += h.slots.repair(self.name(), &dead);
        let d = self.derive(h);
        h.n_msgs.store(d.n_msgs, Ordering::Relaxed);
        h.pending.store(d.pending, Ordering::Relaxed);
        h.side_bytes.store(d.side_bytes, Ordering::Relaxed);
        for &(p, was) in &dead_entries {
            h.parties.free(p, was);
        }
        let (r, w) = h.parties.sleeping();
        h.readers_waiting.store(r, Ordering::SeqCst);
        h.writers_waiting.store(w, Ordering::SeqCst);
        self.advance_tail(h);
        if found > 0 || !dead.is_empty() {
            h.data_seq.0.fetch_add(1, Ordering::SeqCst);
            crate::wait::wake_all(&h.data_seq.0);
            self.wake_writers();
        }
        found
    }

    /// Under the lock: the counters as the records in `[tail, head)` say they should be.
    fn derive(&self, h: &Header) -> Derived {
        let (tail, read, head) = (
            h.tail.load(Ordering::Relaxed),
            h.read.load(Ordering::Relaxed),
            h.head.load(Ordering::Relaxed),
        );
        let mut d = Derived::default();
        let mut pos = tail;
        while pos < head {
            let rec = self.rec(pos);
            if !self.sane(pos, rec, head) {
                break;
            }
            if rec.state.load(Ordering::Acquire) != ST_PAD {
                d.n_msgs += 1;
                if pos >= read {
                    d.pending += 1;
                }
                if rec.flags.load(Ordering::Relaxed) & (FLAG_SIDE | FLAG_SLOT) != 0 {
                    d.side_bytes += rec.body_len.load(Ordering::Relaxed);
                }
            }
            pos += rec.size.load(Ordering::Relaxed);
        }
        d
    }

    /// Checks the queue's invariants under the lock (waiting until `deadline`): positions in
    /// order, counters equal to what the ring holds, pooled bytes equal to the slots' sizes.
    /// For tests and diagnostics; `Err(Invalid)` describes the first mismatch.
    pub fn audit(&self, deadline: Option<Instant>) -> Result<()> {
        let _g = self.lock_until(deadline)?;
        let h = self.hdr();
        self.advance_tail(h);
        let (tail, read, head) = (
            h.tail.load(Ordering::Relaxed),
            h.read.load(Ordering::Relaxed),
            h.head.load(Ordering::Relaxed),
        );
        if !(tail <= read && read <= head && head - tail <= self.ring_size) {
            return Err(CoreError::Invalid(format!(
                "positions out of order: tail {tail}, read {read}, head {head}"
            )));
        }
        let want = self.derive(h);
        let have = Derived {
            n_msgs: h.n_msgs.load(Ordering::Relaxed),
            pending: h.pending.load(Ordering::Relaxed),
            side_bytes: h.side_bytes.load(Ordering::Relaxed),
        };
        if want != have {
            return Err(CoreError::Invalid(format!(
                "counters {have:?} differ from the ring's {want:?}"
            )));
        }
        Ok(())
    }
}
