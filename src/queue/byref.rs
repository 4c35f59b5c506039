//! Sending by reference: a writer leases a pooled slot, writes its data there itself (a
//! producer's numpy array or tensor lives in it), and sends it without copying. The record in
//! the ring carries a *reference table* naming the slots of such parts; the reader gets
//! zero-copy views of the same pages, and the slot returns to the pool when they are gone.
//! The slot life cycle and what a death between any two steps leaves are in
//! [`crate::slots`] ("Sending by reference"); repair's side is in `recover.rs`.

use super::layout::*;
use super::Queue;
use crate::error::{CoreError, Result};
use crate::shm::Segment;
use crate::slots::Lease;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// A slot a writer leased: its mapping in this process and the lease that frees it (unless
/// the slot is sent).
pub struct WriterSlot {
    pub seg: Arc<Segment>,
    pub lease: Lease,
}

impl Queue {
    /// Leases a pooled slot of at least `len` bytes for this process to write into, waiting
    /// for the lock until `deadline`. `Ok(None)` when the pool cannot give one within its cap
    /// (the caller then uses private memory and the copy path): it never waits for a slot.
    pub fn lease_slot(&self, len: u64, deadline: Option<Instant>) -> Result<Option<WriterSlot>> {
        let h = self.hdr();
        let me = self.party()?;
        let t = {
            let _g = self.lock_until(deadline)?;
            if h.closed.load(Ordering::SeqCst) != 0 {
                return Err(CoreError::Closed);
            }
            match h.slots.take(
                self.name(),
                len.max(1),
                me,
                h.total_bytes.load(Ordering::Relaxed),
            ) {
                Some(t) => t,
                None => return Ok(None),
            }
        };
        match self.maps.get(self.name(), &self.hdr().slots, t) {
            Ok(seg) => {
                let lease = Lease::new(self.seg.clone(), Self::table_at(), t.idx, t.gen, me);
                Ok(Some(WriterSlot { seg, lease }))
            }
            Err(e) => {
                self.discard_slots(vec![(t.idx, t.gen)], true);
                Err(e)
            }
        }
    }

    /// Puts one message whose parts named in `refs` travel by reference: their bytes are
    /// already in slots this process leased ([`Queue::lease_slot`]), and `parts` holds an
    /// empty slice in their place. Waits for room until `deadline` (`Err(Full)` then, the
    /// leases still held). On `Ok`, the slots belong to the ring: the caller disarms its
    /// leases. On an error after the slots were handed over, the record is abandoned and its
    /// slots discarded (their generations die with them, so a stale lease frees nothing).
    pub fn put_refs(
        &self,
        seq: u64,
        kind: u32,
        parts: &[&[u8]],
        refs: &[RefEntry],
        deadline: Option<Instant>,
    ) -> Result<()> {
        if refs.len() > MAX_REFS {
            return Err(CoreError::Invalid(format!(
                "at most {MAX_REFS} parts of a message travel by reference"
            )));
        }
        let h = self.hdr();
        let body = body_len(parts);
        loop {
            let seen = h.space_seq.0.load(Ordering::SeqCst);
            match self.lock_until(deadline) {
                Ok(g) => {
                    let me = self.party()?;
                    if h.closed.load(Ordering::SeqCst) != 0 {
                        return Err(CoreError::Closed);
                    }
                    if let Some(r) = refs
                        .iter()
                        .find(|r| !h.slots.held_by(r.slot as usize, r.gen, me))
                    {
                        return Err(CoreError::Invalid(format!(
                            "slot {} is not leased by this process any more",
                            r.slot
                        )));
                    }
                    let np = parts.len() as u32;
                    if let Some(res) = self.try_reserve(h, me, seq, kind, np, body, refs) {
                        let bytes = parts.iter().map(|p| p.len() as u64).sum::<u64>()
                            + refs.iter().map(|r| r.len).sum::<u64>();
                        locked_add(&h.total_puts.0, 1);
                        locked_add(&h.total_bytes, bytes);
                        drop(g);
                        return self.fill_and_commit(res, parts);
                    }
                }
                Err(CoreError::Busy { .. }) if deadline.map_or(true, |d| Instant::now() < d) => {}
                Err(CoreError::Busy { .. }) => return Err(CoreError::Full),
                Err(e) => return Err(e),
            }
            if !self.wait_for_space(seen, deadline) {
                return Err(CoreError::Full);
            }
        }
    }

    /// The reference table of the record at `pos` (written under the lock before the record
    /// was published, so it can be trusted whatever happened to the body). Empty for a record
    /// without one, or one whose table would not fit in it (a corrupt record).
    pub(super) fn refs_of(&self, pos: u64, rec: &RecordHeader) -> Vec<RefEntry> {
        let n = refs_count(rec);
        let size = rec.size.load(Ordering::Relaxed);
        let table = refs_bytes(n);
        if n == 0 || REC_BYTES + table > size || pos % self.ring_size + size > self.ring_size {
            return Vec::new();
        }
        // SAFETY: the table is the record's last `table` bytes, inside the record (checked
        // above), which lies inside the ring.
        unsafe {
            read_refs(
                self.body_ptr(pos).add((size - table - REC_BYTES) as usize),
                n,
            )
        }
    }

    /// Under the lock: discards the slots that the record at `pos` sends by reference and
    /// that are still in the ring's hands or its writer's (the record is being abandoned).
    pub(super) fn discard_refs(&self, pos: u64, rec: &RecordHeader) {
        let h = self.hdr();
        for r in self.refs_of(pos, rec) {
            h.slots.discard(
                self.name(),
                (r.slot as usize).min(crate::slots::SLOTS - 1),
                r.gen,
            );
        }
    }
}
