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
//! | a writer, copying (record WRITING) | a record that never commits | marked ABANDONED (compare-and-swap from its stamped WRITING word); its one-shot segment unlinked, its slot discarded |
//! | a writer judged dead that is alive (its liveness token deleted), copying | as above, and later a commit | its commit is a compare-and-swap from WRITING, which fails on the ABANDONED word: its `put` gets `JudgedDead` (the message was not put, nothing acknowledged is lost), and nothing lands behind `read` |
//! | a writer, sending by reference, before `head` moved | slots BUSY(dead writer), not in the ring | discarded (dead holder) |
//! | a writer, sending by reference, after `head` moved | a WRITING record whose table names slots BUSY(0) or BUSY(dead) | marked ABANDONED; every slot its table names discarded |
//! | a writer, holding a leased slot it has not sent | a slot BUSY with a dead holder | slot discarded, its segment unlinked |
//! | a reader, in `claim` before `read` is stored | records READING at or after `read` | given back as READY (nobody received them) |
//! | a reader, in `take_small`'s copy | its record READING at `read` | given back as READY |
//! | a reader, after its claim (record READING before `read`) | a message delivered to a dead process | marked ABANDONED (the reader had it) |
//! | a reader, holding views of a pooled slot | a slot BUSY with a dead holder | slot discarded, its segment unlinked |
//! | a reader judged dead that is alive, after its claim | records READING before `read`, slots BUSY(its token) | marked ABANDONED and its slots discarded, as for a dead reader; it lost nothing: `claim` maps every side segment before it lets go of the lock, its mappings outlive the names, and its release (a compare-and-swap from READING) leaves the repaired records alone |
//! | anyone, in `slots.take`/`evict` | a slot half-changed, `pool_bytes` off | EMPTY slots zeroed, `pool_bytes` rebuilt |
//! | a waiter, asleep | its sleeping count raised | when its entry is freed, its own count is taken off the totals (atomic, saturating: never a store racing live waiters) |
//! | a reader, asleep or about to sleep (or stopped there) | `last_reader` naming it | nothing: a hint. A commit's wake aimed at it wakes nobody if it is gone, and then wakes any sleeping reader; one that is stopped takes the wake, and the others find the message when their sleep ends (a tick), as with any wake a stopped waiter takes |
//! | (a corrupt segment) | positions more than a ring apart, or a READY/WRITING record behind `read` | the walk stops at the ring's size; such records are abandoned so the tail passes them, and `audit()` reports them |
//! | a releaser, before the tail moved | DONE records before `read` | the next lock holder advances the tail |
//! | the queue's creator, anywhere | a queue whose names stay while any party holds the queue's token (`liveness::QueueToken`), then go with the last party or the next sweep | a waiter that finds it dead closes the queue (`close_if_owner_died`): gets drain what is left, then fail `Closed`; puts fail |
//!
//! Records and slots name parties by *token* (party number and generation, `parties`): a
//! token whose registration was freed or adopted is stale and counts as dead, so nothing a
//! dead party left can be taken for a new party's. After the records, slots and counts that
//! named them are mended, the dead parties' entries are freed.
//!
//! What a process judged dead while alive can still do: it may hold the lock (a false death
//! of the lock holder lets a second process in, which only kernel-vouched liveness prevents),
//! and a writer copying inline may finish its copy into ring space that repair freed and the
//! tail passed; its commit is refused either way. A stopped process is alive: nothing it holds is taken from it; waiters time out
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
            Ok(_g) => self.repair(self.hdr()),
            Err(_) => 0,
        }
    }

    /// Under the lock: mends everything dead parties left (see the table above).
    pub(super) fn repair(&self, h: &Header) -> usize {
        let dead = h.parties.dead();
        let gone = |t: u32| h.parties.gone(t, &dead);
        // Positions: a restart of an empty ring may have stopped after one or two stores.
        let tail = h.tail.load(Ordering::Relaxed);
        let mut read = h.read.load(Ordering::Relaxed).max(tail);
        let mut head = h.head.load(Ordering::Relaxed).max(read);
        if head - tail > self.ring_size {
            // More than a ring apart: a corrupt segment. Keep what one ring can hold.
            head = tail + self.ring_size;
            read = read.min(head);
        }
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
            let st = rec.state();
            let owner = rec.owner.load(Ordering::Relaxed);
            if st == ST_READING && pos >= read {
                // A claim that never completed: nobody received it.
                rec.set_state(pos, ST_READY);
                if rec.flags.load(Ordering::Relaxed) & FLAG_SLOT != 0 {
                    let (idx, gen) = slot_of(rec);
                    h.slots.hand_to(idx, gen, 0);
                }
                for r in self.refs_of(pos, rec) {
                    h.slots.hand_to(r.slot as usize, r.gen, 0);
                }
                found += 1;
            } else if matches!(st, ST_WRITING | ST_READING) && gone(owner) {
                // Compare-and-swap: a writer judged dead that is in fact alive may commit
                // at this very moment; exactly one of us wins.
                if rec.change(pos, st, ST_ABANDONED) {
                    self.drop_record_sides(pos, rec, st);
                    found += 1;
                }
            } else if pos < read && matches!(st, ST_READY | ST_WRITING) {
                // Behind `read`, nobody will claim it, and the tail would stop at it for
                // ever: impossible by the protocol (a commit is refused once its record is
                // abandoned), so a corrupt segment. Give it up so the queue goes on.
                if rec.change(pos, st, ST_ABANDONED) {
                    self.drop_record_sides(pos, rec, st);
                    found += 1;
                }
            }
            pos += rec.size.load(Ordering::Relaxed);
        }
        found += h.slots.repair(self.name(), &gone);
        let d = self.derive(h);
        h.n_msgs.store(d.n_msgs, Ordering::Relaxed);
        h.pending.store(d.pending, Ordering::Relaxed);
        h.side_bytes.store(d.side_bytes, Ordering::Relaxed);
        for &(p, was) in &dead {
            let waits = h.parties.free(p, was);
            super::parties::forget_sleepers(&h.readers_waiting, &h.writers_waiting, waits);
        }
        self.advance_tail(h);
        if found > 0 || !dead.is_empty() {
            h.data_seq.0.fetch_add(1, Ordering::SeqCst);
            crate::wait::wake_all(&h.data_seq.0);
            self.wake_writers();
        }
        found
    }

    /// Under the lock: what an abandoned record (it was in state `st`) held goes with it.
    fn drop_record_sides(&self, pos: u64, rec: &RecordHeader, st: u32) {
        let h = self.hdr();
        let flags = rec.flags.load(Ordering::Relaxed);
        if flags & FLAG_SIDE != 0 {
            let _ = crate::shm::unlink_name(&self.side_name(pos, rec));
        } else if flags & FLAG_SLOT != 0 && st != ST_READING {
            // Unread (half written, or committed behind `read`): the slot's content is
            // nobody's. A dead reader's slot goes with the slot repair, by its holder.
            let (idx, gen) = slot_of(rec);
            h.slots.discard(self.name(), idx, gen);
        }
        if st != ST_READING {
            // Its slots sent by reference: BUSY(0) or still BUSY(the writer).
            self.discard_refs(pos, rec);
        }
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
        if head.wrapping_sub(tail) > self.ring_size {
            return d;
        }
        while pos < head {
            let rec = self.rec(pos);
            if !self.sane(pos, rec, head) {
                break;
            }
            if rec.state() != ST_PAD {
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
        // States by region: claimed or passed records behind `read` (READY or WRITING there
        // would pin the tail for ever), and every record stamped with its own position.
        let mut pos = tail;
        while pos < head {
            let rec = self.rec(pos);
            if !self.sane(pos, rec, head) {
                return Err(CoreError::Invalid(format!(
                    "record at position {pos} has a size that leaves the ring"
                )));
            }
            let st = rec.state();
            if !rec.stamped(pos) {
                return Err(CoreError::Invalid(format!(
                    "record at position {pos} is not stamped with its position"
                )));
            }
            if pos < read && matches!(st, ST_READY | ST_WRITING) {
                return Err(CoreError::Invalid(format!(
                    "record at position {pos} is {} behind read {read}: it would never be \
                     read, and the tail would stop at it",
                    if st == ST_READY { "READY" } else { "WRITING" }
                )));
            }
            pos += rec.size.load(Ordering::Relaxed);
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
