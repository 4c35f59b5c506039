//! A sequence-ordered reorder buffer with a bounded window.
//!
//! Items arrive tagged with sequence numbers in any order; [`ReorderBuffer::pop`] hands them
//! out strictly in sequence order. Only sequence numbers in `[next, next + window)` are
//! accepted, so memory stays bounded by `window` items however far ahead a fast producer runs:
//! a dispatcher asks [`ReorderBuffer::admits`] before it sends item `seq` out, and waits for the
//! consumer when the answer is no. Slots live in a ring of `window` entries indexed by
//! `seq % window`, so push and pop are O(1) and nothing is allocated after construction.

use crate::error::{CoreError, Result};

/// Largest window: 64 Mi items (half a GiB of slots for pointers); larger ones are refused.
pub const MAX_WINDOW: usize = 1 << 26;

/// The reorder buffer.
#[derive(Debug)]
pub struct ReorderBuffer<T> {
    slots: Vec<Option<T>>,
    next: u64,
    held: usize,
}

impl<T> ReorderBuffer<T> {
    /// A buffer that holds at most `window` items, starting at sequence number `start`.
    pub fn new(window: usize, start: u64) -> Result<Self> {
        if window == 0 || window > MAX_WINDOW {
            return Err(CoreError::Invalid(format!(
                "the reorder window must be between 1 and {MAX_WINDOW}, got {window}"
            )));
        }
        let mut slots = Vec::new();
        slots.try_reserve_exact(window).map_err(|_| {
            CoreError::Invalid(format!(
                "not enough memory for a reorder window of {window} items"
            ))
        })?;
        slots.resize_with(window, || None);
        Ok(ReorderBuffer {
            slots,
            next: start,
            held: 0,
        })
    }

    /// The window size.
    pub fn window(&self) -> usize {
        self.slots.len()
    }

    /// The next sequence number [`ReorderBuffer::pop`] will hand out.
    pub fn next_seq(&self) -> u64 {
        self.next
    }

    /// Items held (arrived, not yet popped).
    pub fn len(&self) -> usize {
        self.held
    }

    /// Whether no item is held.
    pub fn is_empty(&self) -> bool {
        self.held == 0
    }

    /// Whether `seq` lies inside the window (may be pushed now).
    pub fn admits(&self, seq: u64) -> bool {
        seq >= self.next && seq - self.next < self.slots.len() as u64
    }

    /// Stores `item` under `seq`. Errors when `seq` is outside the window or already held.
    pub fn push(&mut self, seq: u64, item: T) -> Result<()> {
        if seq < self.next {
            return Err(CoreError::Invalid(format!(
                "sequence number {seq} was already delivered (next is {})",
                self.next
            )));
        }
        if !self.admits(seq) {
            return Err(CoreError::Invalid(format!(
                "sequence number {seq} is outside the reorder window [{}, {})",
                self.next,
                self.next + self.slots.len() as u64
            )));
        }
        let w = self.slots.len() as u64;
        let slot = &mut self.slots[(seq % w) as usize];
        if slot.is_some() {
            return Err(CoreError::Invalid(format!(
                "sequence number {seq} was pushed twice"
            )));
        }
        *slot = Some(item);
        self.held += 1;
        Ok(())
    }

    /// The item with the next sequence number, if it has arrived.
    pub fn pop(&mut self) -> Option<(u64, T)> {
        let w = self.slots.len() as u64;
        let item = self.slots[(self.next % w) as usize].take()?;
        let seq = self.next;
        self.next += 1;
        self.held -= 1;
        Some((seq, item))
    }

    /// Skips sequence number `next` without an item (it was lost or filtered out), handing out
    /// what was stored there, if anything.
    pub fn skip(&mut self) -> Option<T> {
        let w = self.slots.len() as u64;
        let item = self.slots[(self.next % w) as usize].take();
        if item.is_some() {
            self.held -= 1;
        }
        self.next += 1;
        item
    }

    /// Drops every held item and restarts at `start`.
    pub fn reset(&mut self, start: u64) {
        self.slots.iter_mut().for_each(|s| *s = None);
        self.held = 0;
        self.next = start;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (xorshift) so the tests need no extra crate.
    fn shuffle<T>(v: &mut [T], mut seed: u64) {
        for i in (1..v.len()).rev() {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            v.swap(i, (seed % (i as u64 + 1)) as usize);
        }
    }

    #[test]
    fn any_permutation_comes_out_in_order() {
        for seed in 1..200u64 {
            let n = 1 + (seed as usize * 7) % 64;
            let mut seqs: Vec<u64> = (0..n as u64).collect();
            shuffle(&mut seqs, seed);
            let mut rb = ReorderBuffer::new(n, 0).unwrap();
            let mut out = Vec::new();
            for s in seqs {
                rb.push(s, s * 10).unwrap();
                while let Some((seq, v)) = rb.pop() {
                    assert_eq!(v, seq * 10);
                    out.push(seq);
                }
            }
            assert_eq!(out, (0..n as u64).collect::<Vec<_>>());
            assert!(rb.is_empty());
        }
    }

    #[test]
    fn window_is_respected_while_streaming() {
        // A producer that runs ahead by at most `window` keeps the buffer bounded.
        let w = 8;
        let mut rb = ReorderBuffer::new(w, 100).unwrap();
        let mut next_to_send = 100u64;
        let mut delivered = 100u64;
        let mut pending: Vec<u64> = Vec::new();
        let mut seed = 99u64;
        while delivered < 10_000 {
            while rb.admits(next_to_send) && pending.len() < w {
                pending.push(next_to_send);
                next_to_send += 1;
            }
            shuffle(&mut pending, seed);
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            let s = pending.pop().unwrap();
            rb.push(s, ()).unwrap();
            assert!(rb.len() <= w);
            while let Some((seq, ())) = rb.pop() {
                assert_eq!(seq, delivered);
                delivered += 1;
            }
        }
    }

    #[test]
    fn out_of_window_and_duplicates_are_errors() {
        let mut rb = ReorderBuffer::new(4, 10).unwrap();
        assert!(!rb.admits(14));
        assert!(rb.push(14, 0).unwrap_err().to_string().contains("outside"));
        assert!(rb
            .push(9, 0)
            .unwrap_err()
            .to_string()
            .contains("already delivered"));
        rb.push(11, 1).unwrap();
        assert!(rb.push(11, 1).unwrap_err().to_string().contains("twice"));
        assert!(rb.pop().is_none());
        assert_eq!(rb.skip(), None);
        assert_eq!(rb.pop(), Some((11, 1)));
        assert!(ReorderBuffer::<u8>::new(0, 0).is_err());
    }

    #[test]
    fn reset_drops_everything() {
        let mut rb = ReorderBuffer::new(4, 0).unwrap();
        rb.push(1, "b").unwrap();
        rb.reset(50);
        assert_eq!(rb.len(), 0);
        assert_eq!(rb.next_seq(), 50);
        rb.push(50, "x").unwrap();
        assert_eq!(rb.pop(), Some((50, "x")));
    }
}
