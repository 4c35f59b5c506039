//! Reading: claim committed records in FIFO order under the lock, copy or map them with no
//! lock held, release them with one store each. Every size read from shared memory is checked
//! before it is used, so a corrupt segment gives an error, never a wild read.

use super::layout::*;
use super::{Queue, Waited};
use crate::error::{CoreError, Result};
use crate::shm::Segment;
use crate::slots::{SideBuf, Taken};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// Most parts a message may have for [`Queue::take_small`].
pub const SMALL_PARTS: usize = 4;

/// A claimed message: its record stays reserved until [`Queue::release`].
#[derive(Debug)]
pub struct Claimed {
    pub(super) pos: u64,
    /// The message's sequence number.
    pub seq: u64,
    /// The message's kind tag.
    pub kind: u32,
    /// (offset, length) of each part: from the record's body in the ring, or from the start
    /// of the side segment.
    pub parts: Vec<(u64, u64)>,
    /// The side segment of a large message (a leased slot, or a one-shot segment already
    /// unlinked); zero-copy views keep it alive.
    pub side: Option<Arc<SideBuf>>,
    /// Parts sent by reference: (part index, the slot's buffer with its lease, offset, len).
    pub refs: Vec<(usize, Arc<SideBuf>, u64, u64)>,
    /// The record's body length (checked against the ring or the side segment).
    body: u64,
    released: bool,
}

/// What [`Queue::take_small`] found.
#[derive(Debug)]
pub enum Small<R> {
    /// The next message, already released; what the callback made of it.
    Took(R),
    /// The next message is large or has many parts: [`Queue::claim`] it.
    NotSmall,
    /// No message is ready now.
    Empty,
    /// The lock is held by someone else right now: go the slow way ([`Queue::claim`]).
    Busy,
}

/// A side segment to map at claim.
enum SideRef {
    OneShot(String),
    Slot(usize, u64),
    /// A part sent by reference.
    Ref(RefEntry),
}

/// The slot (index, generation) of a slot record.
pub(super) fn slot_of(rec: &RecordHeader) -> (usize, u64) {
    (
        (rec.slot.load(Ordering::Relaxed) as usize).min(crate::slots::SLOTS - 1),
        rec.slot_gen.load(Ordering::Relaxed),
    )
}

impl Queue {
    /// Whether the record at `pos` has a size that keeps it inside the ring and before
    /// `head`; records failing this are corrupt and are not followed.
    pub(super) fn sane(&self, pos: u64, rec: &RecordHeader, head: u64) -> bool {
        let size = rec.size.load(Ordering::Relaxed);
        size >= REC_BYTES
            && size % ALIGN == 0
            && pos % self.ring_size + size <= self.ring_size
            && pos.checked_add(size).is_some_and(|e| e <= head)
    }

    /// Whether positions `lo <= hi` are further apart than one ring (or out of order): a
    /// corrupt segment, whose records must not be walked.
    pub(super) fn apart(&self, lo: u64, hi: u64) -> bool {
        hi.checked_sub(lo).map_or(true, |d| d > self.ring_size)
    }

    fn corrupt_positions(&self, lo: u64, hi: u64) -> CoreError {
        CoreError::BadSegment(format!(
            "{}: corrupt positions {lo} and {hi} (more than a ring apart)",
            self.name()
        ))
    }

    /// Claims up to `max` committed messages in FIFO order; blocks for the first one until
    /// `deadline` (`None`: forever). Each claim must be given back to [`Queue::release`].
    pub fn claim(&self, max: usize, deadline: Option<Instant>) -> Result<Vec<Claimed>> {
        let h = self.hdr();
        let mut out = Vec::new();
        let mut waited = Waited::Woke;
        loop {
            let seen = h.data_seq.0.load(Ordering::SeqCst);
            let mut sides = Vec::new();
            let mut map_err = None;
            match self.lock_until(deadline) {
                Ok(_g) => {
                    let me = self.party()?;
                    let head = h.head.load(Ordering::Relaxed);
                    let mut read = h.read.load(Ordering::Relaxed);
                    if self.apart(read, head) {
                        return Err(self.corrupt_positions(read, head));
                    }
                    while read < head && out.len() < max.max(1) {
                        let rec = self.rec(read);
                        if !self.sane(read, rec, head) {
                            // Corrupt: nothing after it can be trusted. Leave the queue as is.
                            return Err(CoreError::BadSegment(format!(
                                "{}: corrupt record at position {read}",
                                self.name()
                            )));
                        }
                        let size = rec.size.load(Ordering::Relaxed);
                        match rec.state() {
                            ST_PAD => {}
                            ST_ABANDONED => locked_sub(&h.pending, 1),
                            ST_READY => {
                                let flags = rec.flags.load(Ordering::Relaxed);
                                let refs = self.refs_of(read, rec);
                                let lost = (flags & FLAG_SLOT != 0 && {
                                    let (idx, gen) = slot_of(rec);
                                    !h.slots.holds(idx, gen)
                                }) || refs
                                    .iter()
                                    .any(|r| !h.slots.holds(r.slot as usize, r.gen))
                                    || refs.len() != refs_count(rec);
                                if lost {
                                    // A slot of it was lost (a writer's failure): skip it,
                                    // and discard the slots it still names.
                                    self.discard_refs(read, rec);
                                    rec.set_state(read, ST_ABANDONED);
                                    locked_sub(&h.pending, 1);
                                    read += size;
                                    continue;
                                }
                                for r in refs {
                                    h.slots.hand_to(r.slot as usize, r.gen, me);
                                    sides.push((out.len(), SideRef::Ref(r)));
                                }
                                if flags & FLAG_SLOT != 0 {
                                    let (idx, gen) = slot_of(rec);
                                    h.slots.hand_to(idx, gen, me);
                                    sides.push((out.len(), SideRef::Slot(idx, gen)));
                                } else if flags & FLAG_SIDE != 0 {
                                    sides.push((
                                        out.len(),
                                        SideRef::OneShot(self.side_name(read, rec)),
                                    ));
                                }
                                rec.owner.store(me, Ordering::Relaxed);
                                rec.set_state(read, ST_READING);
                                locked_sub(&h.pending, 1);
                                out.push(self.describe(read, rec));
                            }
                            _ => break, // WRITING: FIFO order waits for it
                        }
                        read += size;
                    }
                    // One store makes the claims ours: a death before it leaves the records
                    // READING at or after `read`, which repair gives back as READY.
                    h.read.store(read, Ordering::Release);
                    // Map the side segments while the lock is held: a repair that judged
                    // this process dead (while it is alive) could otherwise unlink a name
                    // between the claim and the mapping, and the message would be lost.
                    map_err = self.map_sides(&mut out, std::mem::take(&mut sides), me);
                }
                Err(CoreError::Busy { .. }) => {}
                Err(e) => return Err(e),
            }
            self.settle_read_spin(waited, !out.is_empty());
            if !out.is_empty() {
                self.check_tables(&mut out, map_err)?;
                return Ok(out);
            }
            if h.closed.load(Ordering::SeqCst) != 0 && h.pending.load(Ordering::Relaxed) == 0 {
                return Err(CoreError::Closed);
            }
            waited = self.wait_readable(seen, deadline);
            if waited == Waited::TimedOut {
                return Err(CoreError::Empty);
            }
        }
    }

    /// Takes the next message if it is small and inline (at most [`SMALL_PARTS`] parts and
    /// `limit` bytes of body): hands its seq, kind and parts to `f`, then releases its record,
    /// all under *one* hold of the lock, where [`Queue::claim`] + [`Queue::release`] take it
    /// twice. This is the fast path for one small message per call. Never blocks: it only
    /// tries the lock ([`Small::Busy`] if someone holds it).
    ///
    /// `f` runs with the queue lock held: it must be short, must not block, and must not
    /// touch this queue (the lock is not reentrant). A process killed inside `f` leaves the
    /// record `READING` at `read`, which repair gives back as `READY`: the message is not lost.
    /// If `f` fails (say, out of memory), the message stays first in the queue, as if not
    /// taken, and `Small::Took(Err(..))` carries the error.
    pub fn take_small<R, E>(
        &self,
        limit: u64,
        f: impl FnOnce(u64, u32, &[&[u8]]) -> std::result::Result<R, E>,
    ) -> Result<Small<std::result::Result<R, E>>> {
        let h = self.hdr();
        let _g = match self.try_lock() {
            Ok(g) => g,
            Err(CoreError::Busy { .. }) => return Ok(Small::Busy),
            Err(e) => return Err(e),
        };
        let head = h.head.load(Ordering::Relaxed);
        let mut read = h.read.load(Ordering::Relaxed);
        if self.apart(read, head) {
            return Ok(Small::NotSmall); // let claim report it
        }
        let found = loop {
            if read >= head {
                break None;
            }
            let rec = self.rec(read);
            if !self.sane(read, rec, head) {
                return Ok(Small::NotSmall); // let claim report it
            }
            match rec.state() {
                ST_PAD => {}
                ST_ABANDONED => locked_sub(&h.pending, 1),
                ST_READY => break Some(rec),
                _ => break None, // WRITING: FIFO order waits for it
            }
            read += rec.size.load(Ordering::Relaxed);
        };
        // Records skipped above are passed for good.
        h.read.store(read, Ordering::Relaxed);
        let Some(rec) = found else {
            if h.closed.load(Ordering::SeqCst) != 0 && h.pending.load(Ordering::Relaxed) == 0 {
                return Err(CoreError::Closed);
            }
            return Ok(Small::Empty);
        };
        let nparts = rec.nparts.load(Ordering::Relaxed) as usize;
        let body = rec.body_len.load(Ordering::Relaxed);
        let size = rec.size.load(Ordering::Relaxed);
        if rec.flags.load(Ordering::Relaxed) != 0
            || nparts > SMALL_PARTS
            || body > limit
            || REC_BYTES + body > size
        {
            return Ok(Small::NotSmall);
        }
        let base = self.body_ptr(read) as *const u8;
        // SAFETY: the body (`body` bytes, inside the record, checked above) was filled by the
        // writer before it committed, and we hold the record under the lock.
        let Some(spans) = (unsafe { read_part_table(base, nparts, body) }) else {
            return Ok(Small::NotSmall); // not a table the writer made; leave it to claim
        };
        rec.owner.store(self.party()?, Ordering::Relaxed);
        rec.set_state(read, ST_READING);
        let mut parts: [&[u8]; SMALL_PARTS] = [&[]; SMALL_PARTS];
        for (p, &(off, len)) in parts.iter_mut().zip(&spans) {
            // SAFETY: the part lies inside the record's body (checked by read_part_table),
            // in the ring, and stays ours (READING) until we mark it DONE below.
            *p = unsafe { std::slice::from_raw_parts(base.add(off as usize), len as usize) };
        }
        let out = f(
            rec.seq.load(Ordering::Relaxed),
            rec.kind.load(Ordering::Relaxed),
            &parts[..nparts],
        );
        if out.is_err() {
            // Not delivered: the message stays first in the queue.
            rec.set_state(read, ST_READY);
            return Ok(Small::Took(out));
        }
        // Delivered: a death after this store abandons the record (its reader had it).
        h.read.store(read + size, Ordering::Release);
        rec.set_state(read, ST_DONE);
        locked_sub(&h.pending, 1);
        self.advance_tail(h);
        Ok(Small::Took(out))
    }

    fn describe(&self, pos: u64, rec: &RecordHeader) -> Claimed {
        let nparts = rec.nparts.load(Ordering::Relaxed) as usize;
        Claimed {
            pos,
            seq: rec.seq.load(Ordering::Relaxed),
            kind: rec.kind.load(Ordering::Relaxed),
            parts: Vec::with_capacity(nparts.min(1024)),
            side: None,
            refs: Vec::new(),
            body: rec.body_len.load(Ordering::Relaxed),
            released: false,
        }
    }

    pub(super) fn side_name(&self, pos: u64, rec: &RecordHeader) -> String {
        let room = rec.size.load(Ordering::Relaxed).saturating_sub(REC_BYTES);
        let n = (rec.name_len.load(Ordering::Relaxed) as u64)
            .min(ALIGN * 2)
            .min(room) as usize;
        let mut buf = vec![0u8; n];
        // SAFETY: the writer stored `name_len` bytes of name after the header under the lock;
        // `n` is at most the record's room and 128.
        unsafe { std::ptr::copy_nonoverlapping(self.body_ptr(pos), buf.as_mut_ptr(), n) };
        String::from_utf8_lossy(&buf).into_owned()
    }

    /// Under the lock: maps the side segments of fresh claims. A side that cannot be mapped
    /// is discarded; the first error is returned (the claims are given back by
    /// [`Queue::check_tables`], after the lock).
    fn map_sides(
        &self,
        out: &mut [Claimed],
        sides: Vec<(usize, SideRef)>,
        me: u32,
    ) -> Option<CoreError> {
        let mut err = None;
        let h = self.hdr();
        for (i, side) in sides {
            match side {
                SideRef::OneShot(name) => match Segment::attach(&name) {
                    Ok(seg) => {
                        let _ = seg.unlink();
                        out[i].side = Some(Arc::new(SideBuf::new(Arc::new(seg), None)));
                    }
                    Err(e) => {
                        let _ = crate::shm::unlink_name(&name);
                        err.get_or_insert(e);
                    }
                },
                SideRef::Ref(r) => {
                    let (idx, gen) = (r.slot as usize, r.gen);
                    let t = Taken {
                        idx,
                        gen,
                        size: 0,
                        fresh: false,
                        since_filled: 0,
                    };
                    match self.maps.get(self.name(), &h.slots, t) {
                        Ok(seg)
                            if r.offset
                                .checked_add(r.len)
                                .is_some_and(|e| e <= seg.len() as u64) =>
                        {
                            let buf = self.lease(idx, gen, seg, me);
                            out[i].refs.push((r.part as usize, buf, r.offset, r.len));
                        }
                        other => {
                            h.slots.discard(self.name(), idx, gen);
                            err.get_or_insert(other.err().unwrap_or_else(|| {
                                CoreError::BadSegment(format!(
                                    "{}: a part sent by reference lies outside its slot",
                                    self.name()
                                ))
                            }));
                        }
                    }
                }
                SideRef::Slot(idx, gen) => {
                    let t = Taken {
                        idx,
                        gen,
                        size: 0,
                        fresh: false,
                        since_filled: 0,
                    };
                    match self.maps.get(self.name(), &h.slots, t) {
                        Ok(seg) => out[i].side = Some(self.lease(idx, gen, seg, me)),
                        Err(e) => {
                            h.slots.discard(self.name(), idx, gen);
                            err.get_or_insert(e);
                        }
                    }
                }
            }
        }
        err
    }

    /// After the lock: reads every claim's part table, checking it against the memory that
    /// holds the body. On any error (this one's or `err`, from mapping), every claim is
    /// given back (released) and the first error returned.
    fn check_tables(&self, out: &mut [Claimed], mut err: Option<CoreError>) -> Result<()> {
        for c in out.iter_mut() {
            let rec = self.rec(c.pos);
            let n = rec.nparts.load(Ordering::Relaxed) as usize;
            let (base, room) = match &c.side {
                Some(seg) => (seg.as_ptr() as *const u8, seg.len() as u64),
                None => (
                    self.body_ptr(c.pos) as *const u8,
                    rec.size.load(Ordering::Relaxed) - REC_BYTES,
                ),
            };
            let table = if c.body <= room {
                // SAFETY: `c.body <= room` readable bytes at `base` (the record's room in the
                // ring, or the mapped side segment), held by our claim.
                unsafe { read_part_table(base, n, c.body) }
            } else {
                None
            };
            let refs_ok = table
                .as_ref()
                .is_some_and(|t| c.refs.iter().all(|r| r.0 < t.len() && t[r.0].1 == 0));
            match table {
                Some(t) if refs_ok => c.parts = t,
                _ => {
                    err.get_or_insert(CoreError::BadSegment(format!(
                        "{}: message {} has a corrupt part table",
                        self.name(),
                        c.seq
                    )));
                }
            }
        }
        match err {
            Some(e) => {
                self.release(out);
                Err(e)
            }
            None => Ok(()),
        }
    }

    /// Address of part `i` of a claim (inside the ring or the side segment).
    pub fn part_ptr(&self, c: &Claimed, i: usize) -> *const u8 {
        let (off, _) = c.parts[i];
        let base = match &c.side {
            Some(seg) => seg.as_ptr() as *const u8,
            None => self.body_ptr(c.pos) as *const u8,
        };
        // SAFETY: offsets come from a checked part table and lie inside the body.
        unsafe { base.add(off as usize) }
    }

    /// Gives claims back. Never waits: each record is marked DONE with one store (it is ours);
    /// the tail moves past them now if the lock is free, else whoever takes it next moves it.
    pub fn release(&self, claims: &mut [Claimed]) {
        let mut any = false;
        for c in claims.iter_mut().filter(|c| !c.released) {
            // Only if the claim is still ours: repair may have abandoned it (this process
            // judged dead), and its space may hold another record by now.
            self.rec(c.pos).change(c.pos, ST_READING, ST_DONE);
            c.released = true;
            any = true;
        }
        if !any {
            return;
        }
        match self.try_lock() {
            // advance_tail wakes the writers if it freed space.
            Ok(_g) => self.advance_tail(self.hdr()),
            // Busy: wake the writers anyway; the one that takes the lock advances the tail.
            Err(_) => self.wake_writers(),
        }
    }

    /// Under the lock: moves `tail` over released, padding and abandoned records.
    pub(super) fn advance_tail(&self, h: &Header) {
        let read = h.read.load(Ordering::Relaxed);
        let mut tail = h.tail.load(Ordering::Relaxed);
        if self.apart(tail, read) {
            return; // corrupt positions: repair cuts them back, audit reports them
        }
        let start = tail;
        while tail < read {
            let rec = self.rec(tail);
            if !self.sane(tail, rec, read) {
                break;
            }
            let st = rec.state();
            if !matches!(st, ST_DONE | ST_PAD | ST_ABANDONED) {
                break;
            }
            if st != ST_PAD {
                locked_sub(&h.n_msgs, 1);
                if rec.flags.load(Ordering::Relaxed) & (FLAG_SIDE | FLAG_SLOT) != 0 {
                    locked_sub(&h.side_bytes, rec.body_len.load(Ordering::Relaxed));
                }
            }
            tail += rec.size.load(Ordering::Relaxed);
        }
        if tail != start {
            h.tail.store(tail, Ordering::Relaxed);
            self.wake_writers();
        }
    }
}
