//! Pooled side segments ("slots") that carry a queue's large messages.
//!
//! A message too large for the ring travels in a shared-memory segment of its own and the ring
//! holds only a reference to it. Making a fresh segment per message (create, zero-fill, fault
//! in, free) costs several times more than copying the message, so segments are kept in a
//! small pool and reused: the writer copies into pages that are already mapped on both sides,
//! and the reader hands out zero-copy views. A view keeps its slot busy; when the last view of
//! a message is gone, the slot is free for the next large message.
//!
//! # Life cycle of a slot
//! A slot's state and holder share one word, so every transition is one atomic store or
//! compare-and-swap; transitions marked (lock) happen under the queue's lock.
//! ```text
//! EMPTY        -> BUSY(writer)   take() (lock): a new segment of slot_size(len) bytes
//! FREE         -> BUSY(writer)   take() (lock): the smallest free segment that holds the message
//! BUSY(writer) -> BUSY(0)        commit: the record in the ring holds it (the writer's store)
//! BUSY(0)      -> BUSY(reader)   claim (lock): the reader's views of the message hold it
//! BUSY(reader) -> BUSY(0)        repair (lock): the reader died before its claim completed
//! BUSY(reader) -> FREE           the reader's last view is gone (Lease::drop: compare-and-swap,
//!                                no lock, so dropping a view never waits)
//! BUSY(dead)   -> EMPTY          repair (lock): its holder died; the segment is unlinked
//! FREE         -> EMPTY          evicted by take() to make room under the cap, or by close();
//!                                unlinked
//! ```
//! Sending by reference (a producer writes its result straight into a slot, `queue::byref`):
//! ```text
//! EMPTY/FREE   -> BUSY(writer)   lease (lock): take() for the writer's array, before it is
//!                                written; the writer holds it as a `Lease` of its own
//! BUSY(writer) -> FREE           the writer dropped its array unsent (Lease::drop, the same
//!                                compare-and-swap as a reader's)
//! BUSY(writer) -> BUSY(0)        send (lock): the record's reference table names the slot
//!                                (written before `head` is published); the writer's lease
//!                                is disarmed, so its drop frees nothing
//! BUSY(0)      -> BUSY(reader)   claim (lock), as above; then as above to FREE
//! BUSY(0)      -> EMPTY          the record that names it is abandoned (its writer died before
//!                                committing, or another slot of the record was lost); repair
//!                                or the reader discards the slots its reference table names
//! ```
//! A writer that dies between any two of these steps: holding its lease (BUSY(writer)), the
//! slot is discarded by repair as any dead holder's; after the table is written but before
//! `head` moved, the record is not in the ring and its slots are still BUSY(writer) (the
//! hand-over comes after `head`), so the same; after `head` moved, the record is WRITING with
//! a dead owner and repair abandons it and discards every slot its table names, whichever of
//! BUSY(writer) and BUSY(0) each is in.
//! Holders are party numbers of the queue (`queue::parties`), judged alive or dead by their
//! liveness tokens. `pool_bytes` is derived (the sizes of the slots that are not EMPTY) and
//! rebuilt by repair.
//! The segments of existing slots stay named (`<queue name>.<idx>.<gen>.<hash>`, see
//! [`slot_name`]; the queue name carries the queue's tag) so that any process of the queue can
//! map them; `close()` unlinks the free ones at once and the rest as they are freed, the
//! queue's creator unlinks all of them when it drops the queue, and the last process to leave
//! the queue (or, if every party is killed, the next sweep, [`crate::sweep::sweep_stale`])
//! removes whatever is left: the names live by the queue's token
//! ([`crate::liveness::QueueToken`]), held by every party, not by the creator's life, so a
//! dead creator's messages stay readable until drained. At most `pool_cap` bytes of segments
//! exist at once; a message that cannot get a slot within that cap travels in a one-shot
//! segment instead, as before.
//!
//! Slot names are unguessable: the queue's name is public (`ls /dev/shm`), so `<queue>.<idx>.
//! <gen>` alone would let another user create a slot's *next* name before the writer does (a
//! failed put; never a foreign read, since every attach checks owner and mode). So each name
//! ends with a keyed hash (SipHash-2-4) of `(idx, gen)` under the queue's `name_key`, 64
//! random bits kept in the queue's header, which no other user can read (0600).
//!
//! # Shared-memory layout
//! [`SlotTable`] is `#[repr(C)]` and lives inside the queue's header page: four u64 words
//! (`pool_bytes`, `pool_cap`, `last_gen`, `name_key`), then [`SLOTS`] 32-byte [`Slot`]s
//! (`word: u64` = state | holder << 32, `size: u64, gen: u64, filled_at: u64`).

use crate::error::{CoreError, Result};
use crate::shm::{unlink_name, Segment};
use crate::shmlock::ShmLock;
use crate::wait::current_pid;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, TryLockError};
use std::time::{Duration, Instant};

/// Slots per queue.
pub const SLOTS: usize = 64;

#[cfg(test)]
thread_local! {
    /// Tests: the next `evict` on this thread stops (panics) after its first step, as a
    /// process killed there would.
    pub static DIE_IN_EVICT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

const EMPTY: u32 = 0;
const FREE: u32 = 1;
const BUSY: u32 = 2;

/// One pooled segment's state word and identity.
#[repr(C)]
pub struct Slot {
    /// `state | holder << 32`. BUSY: the holder is the party holding it (the writer while
    /// writing, the reader while its views live), or 0 while a committed record in the ring
    /// holds it; other states have holder 0.
    word: AtomicU64,
    /// Bytes of the segment (0 when EMPTY). Changed under the lock.
    size: AtomicU64,
    /// Generation, part of the segment's name; new for every segment the slot gets.
    gen: AtomicU64,
    /// The queue's count of bytes put (`total_bytes`) when a writer last took the slot.
    /// Set under the lock by `take`; a hint only (it chooses how the next copy into the
    /// segment stores, see `crate::copy`), so any value is safe.
    filled_at: AtomicU64,
}

/// The pool's control block (in the queue header).
#[repr(C)]
pub struct SlotTable {
    /// Bytes of every slot segment that exists.
    pool_bytes: AtomicU64,
    /// `pool_bytes` never exceeds this (checked by `take`). Set at creation; it may only grow
    /// afterwards (`grow_cap`, one atomic max), never shrink, so a `take` that read the old
    /// value stays within the new one.
    pool_cap: AtomicU64,
    /// The last generation handed out.
    last_gen: AtomicU64,
    /// Key of the hash in every slot name ([`slot_name`]): 64 random bits set at creation,
    /// never changed.
    name_key: AtomicU64,
    slots: [Slot; SLOTS],
}

const _: () = assert!(std::mem::size_of::<Slot>() == 32);

/// A slot taken by a writer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Taken {
    pub idx: usize,
    pub gen: u64,
    pub size: u64,
    /// The writer must create the segment (the slot was empty or evicted).
    pub fresh: bool,
    /// Bytes put to the queue since the segment was last taken to be filled (0 for a fresh
    /// one, which the kernel zeroed just now): how likely it is to have left the caches.
    pub since_filled: u64,
}

/// Size of a new segment for a body of `len` bytes: rounded up to 1/16 of itself (and to
/// pages), so that messages of nearly the same size reuse each other's segments.
pub fn slot_size(len: u64) -> u64 {
    let page = 4096;
    let step = (len / 16).max(page).div_ceil(page) * page;
    len.max(1).div_ceil(step) * step
}

/// The name of slot `idx`'s segment of generation `gen` in the queue named `queue` whose
/// table has `key` ([`SlotTable::name_key`]): `<queue>.<idx>.<gen>.<SipHash(key; idx, gen)>`.
pub fn slot_name(queue: &str, key: u64, idx: usize, gen: u64) -> String {
    #[allow(deprecated)] // SipHash-2-4 with our own key; the type is deprecated, not unsound
    let mut h =
        std::hash::SipHasher::new_with_keys(key, key.rotate_left(29) ^ 0x6563_2d73_6c6f_7473);
    std::hash::Hasher::write_u64(&mut h, idx as u64);
    std::hash::Hasher::write_u64(&mut h, gen);
    let mac = std::hash::Hasher::finish(&h);
    format!("{queue}.{idx:x}.{gen:x}.{mac:016x}")
}

fn pack(state: u32, holder: u32) -> u64 {
    u64::from(state) | (u64::from(holder) << 32)
}

impl Slot {
    /// `(state, holder)`.
    fn get(&self) -> (u32, u32) {
        let w = self.word.load(Ordering::Acquire);
        (w as u32, (w >> 32) as u32)
    }

    fn set(&self, state: u32, holder: u32) {
        self.word.store(pack(state, holder), Ordering::Release);
    }

    fn state(&self) -> u32 {
        self.get().0
    }
}

impl SlotTable {
    /// Sets the cap and the name key (64 random bits) at queue creation (the table starts
    /// zeroed: every slot EMPTY).
    pub fn init(&self, pool_cap: u64, name_key: u64) {
        self.pool_cap.store(pool_cap, Ordering::Relaxed);
        self.name_key.store(name_key, Ordering::Relaxed);
    }

    /// The key of the slot names' hash.
    pub fn name_key(&self) -> u64 {
        self.name_key.load(Ordering::Relaxed)
    }

    fn name_of(&self, queue: &str, idx: usize) -> String {
        slot_name(
            queue,
            self.name_key(),
            idx,
            self.slot(idx).gen.load(Ordering::Relaxed),
        )
    }

    /// Bytes of pooled segments that exist, and the cap.
    pub fn bytes(&self) -> (u64, u64) {
        (
            self.pool_bytes.load(Ordering::Relaxed),
            self.pool_cap.load(Ordering::Relaxed),
        )
    }

    /// Raises the cap to `cap` if it is lower (it never shrinks); returns the cap now.
    pub fn grow_cap(&self, cap: u64) -> u64 {
        self.pool_cap.fetch_max(cap, Ordering::AcqRel).max(cap)
    }

    fn slot(&self, idx: usize) -> &Slot {
        &self.slots[idx]
    }

    /// Under the lock: a slot for a body of `len` bytes, held by party `me`, or `None` when
    /// the pool cannot give one (the caller then uses a one-shot segment). Free slots evicted
    /// to make room are unlinked here. `written`: the queue's count of bytes put so far.
    pub fn take(&self, queue: &str, len: u64, me: u32, written: u64) -> Option<Taken> {
        let mut best: Option<usize> = None;
        for (i, s) in self.slots.iter().enumerate() {
            if s.state() == FREE {
                let size = s.size.load(Ordering::Relaxed);
                let smaller = match best {
                    Some(b) => size < self.slot(b).size.load(Ordering::Relaxed),
                    None => true,
                };
                if size >= len && smaller {
                    best = Some(i);
                }
            }
        }
        if let Some(i) = best {
            let s = self.slot(i);
            s.set(BUSY, me);
            let since_filled = written.saturating_sub(s.filled_at.swap(written, Ordering::Relaxed));
            return Some(Taken {
                idx: i,
                gen: s.gen.load(Ordering::Relaxed),
                size: s.size.load(Ordering::Relaxed),
                fresh: false,
                since_filled,
            });
        }
        // No free segment is large enough: make a new one if the cap allows, evicting free
        // (too small) segments as needed.
        let size = slot_size(len);
        let cap = self.pool_cap.load(Ordering::Relaxed);
        let used = self.pool_bytes.load(Ordering::Relaxed);
        let evictable: u64 = self
            .slots
            .iter()
            .filter(|s| s.state() == FREE)
            .map(|s| s.size.load(Ordering::Relaxed))
            .sum();
        let empty = self.slots.iter().position(|s| s.state() == EMPTY);
        if size > cap
            || used.saturating_sub(evictable).saturating_add(size) > cap
            || (empty.is_none() && evictable == 0)
        {
            return None;
        }
        let mut used = used;
        let mut idx = empty;
        for (i, s) in self.slots.iter().enumerate() {
            if used + size <= cap && idx.is_some() {
                break;
            }
            if s.state() == FREE {
                used -= self.evict(queue, i);
                idx.get_or_insert(i);
            }
        }
        let idx = idx?;
        let s = self.slot(idx);
        let gen = self.last_gen.fetch_add(1, Ordering::Relaxed) + 1;
        s.gen.store(gen, Ordering::Relaxed);
        s.size.store(size, Ordering::Relaxed);
        s.filled_at.store(written, Ordering::Relaxed);
        s.set(BUSY, me);
        self.pool_bytes.store(used + size, Ordering::Relaxed);
        Some(Taken {
            idx,
            gen,
            size,
            fresh: true,
            since_filled: 0,
        })
    }

    /// Under the lock: gives back a slot just taken and not used (no room in the ring).
    pub fn untake(&self, t: Taken) {
        let s = self.slot(t.idx);
        if t.fresh {
            // Its segment was never made: nothing to unlink.
            s.set(EMPTY, 0);
            s.size.store(0, Ordering::Relaxed);
            self.pool_bytes.fetch_sub(t.size, Ordering::Relaxed);
        } else {
            s.set(FREE, 0);
        }
    }

    /// Under the lock: empties slot `idx`, unlinks its segment; returns the bytes it had.
    fn evict(&self, queue: &str, idx: usize) -> u64 {
        let s = self.slot(idx);
        let size = s.size.load(Ordering::Relaxed);
        // EMPTY first, then the name: a death in between leaves a name no slot names (the
        // last party to leave or the sweep removes it), never a FREE slot with no segment behind it
        // (which the next take would hand out, losing its message).
        s.set(EMPTY, 0);
        #[cfg(test)]
        if DIE_IN_EVICT.with(|d| d.replace(false)) {
            panic!("died inside evict, after its first step");
        }
        let _ = unlink_name(&self.name_of(queue, idx));
        s.size.store(0, Ordering::Relaxed);
        self.pool_bytes.fetch_sub(size, Ordering::Relaxed);
        size
    }

    fn is(&self, idx: usize, gen: u64) -> bool {
        idx < SLOTS
            && self.slot(idx).gen.load(Ordering::Relaxed) == gen
            && self.slot(idx).state() == BUSY
    }

    /// The generation of slot `idx` if it is FREE (kept for reuse).
    pub fn free_gen(&self, idx: usize) -> Option<u64> {
        (idx < SLOTS && self.slot(idx).state() == FREE)
            .then(|| self.slot(idx).gen.load(Ordering::Relaxed))
    }

    /// Whether slot `idx` is busy with generation `gen` (a record's slot is still there).
    pub fn holds(&self, idx: usize, gen: u64) -> bool {
        self.is(idx, gen)
    }

    /// Whether party `p` holds slot `idx` of generation `gen` (a writer's lease is intact).
    pub fn held_by(&self, idx: usize, gen: u64, p: u32) -> bool {
        self.is(idx, gen) && self.slot(idx).get().1 == p
    }

    /// Commit: the record in the ring now holds the slot (no lock needed: only the writer
    /// touches a slot it holds). One compare-and-swap BUSY(p) -> BUSY(0): false if the slot
    /// is not `p`'s any more (repair took it from a writer it judged dead).
    pub fn hand_to_ring(&self, idx: usize, gen: u64, p: u32) -> bool {
        idx < SLOTS
            && self.slot(idx).gen.load(Ordering::Acquire) == gen
            && self
                .slot(idx)
                .word
                .compare_exchange(
                    pack(BUSY, p),
                    pack(BUSY, 0),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
    }

    /// Under the lock: party `p` (a reader) holds the slot from its claim on; `p = 0` gives
    /// it back to the ring (repair of a claim its reader did not finish).
    pub fn hand_to(&self, idx: usize, gen: u64, p: u32) {
        if self.is(idx, gen) {
            self.slot(idx).set(BUSY, p);
        }
    }

    /// Lock-free: the holder `p` is done with the slot; its segment is kept for reuse. Does
    /// nothing if the slot is no longer `p`'s (repair took it from a party judged dead).
    pub fn give_back(&self, idx: usize, gen: u64, p: u32) {
        if idx >= SLOTS || self.slot(idx).gen.load(Ordering::Relaxed) != gen {
            return;
        }
        let _ = self.slot(idx).word.compare_exchange(
            pack(BUSY, p),
            pack(FREE, 0),
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }

    /// Under the lock: drops a busy slot and its segment (a failed write, a dead holder).
    pub fn discard(&self, queue: &str, idx: usize, gen: u64) {
        if self.is(idx, gen) {
            self.evict(queue, idx);
        }
    }

    /// Under the lock: unlinks and empties every free slot (the queue is closing: no message
    /// will need them). Returns how many.
    pub fn evict_free(&self, queue: &str) -> usize {
        let mut n = 0;
        for i in 0..SLOTS {
            if self.slot(i).state() == FREE {
                self.evict(queue, i);
                n += 1;
            }
        }
        n
    }

    /// Under the lock, after the lock was taken over or a dead party found: discards slots
    /// whose holder is dead, clears what a dead `take`/`evict` left half-done, and rebuilds
    /// `pool_bytes`. Returns how many slots were discarded.
    /// `gone(holder)` says whether a holder's token names a party that is gone.
    pub fn repair(&self, queue: &str, gone: &dyn Fn(u32) -> bool) -> usize {
        let mut n = 0;
        let mut bytes = 0;
        for (i, s) in self.slots.iter().enumerate() {
            let (state, holder) = s.get();
            if state == BUSY && holder != 0 && gone(holder) {
                let _ = unlink_name(&self.name_of(queue, i));
                s.set(EMPTY, 0);
                n += 1;
            }
            if s.state() == EMPTY {
                s.size.store(0, Ordering::Relaxed);
            }
            bytes += s.size.load(Ordering::Relaxed);
        }
        self.pool_bytes.store(bytes, Ordering::Relaxed);
        n
    }

    /// Marks slot `idx` as held by party `p` (tests: simulate a holder that died).
    #[cfg(test)]
    pub fn set_holder(&self, idx: usize, p: u32) {
        self.slot(idx).set(BUSY, p);
    }

    /// Unlinks the segment of every slot that has one (the owner, dropping the queue).
    pub fn unlink_all(&self, queue: &str) {
        for (i, s) in self.slots.iter().enumerate() {
            if s.state() != EMPTY {
                let _ = unlink_name(&self.name_of(queue, i));
            }
        }
    }
}

/// Where to find the lock, the closed flag and the table inside a queue segment, for a
/// [`Lease`] that may outlive the queue handle.
#[derive(Clone, Copy, Debug)]
pub struct TableAt {
    pub lock: usize,
    pub closed: usize,
    pub table: usize,
}

/// A reader's hold on a busy slot: dropping it frees the slot for reuse.
#[derive(Debug)]
pub struct Lease {
    qseg: Arc<Segment>,
    at: TableAt,
    idx: usize,
    gen: u64,
    /// The holding party (in the queue's party table).
    party: u32,
    /// The process that holds it: a forked child's copy of the lease frees nothing.
    pid: u32,
    /// False once a writer's slot was sent by reference: the ring holds it now, and dropping
    /// the lease must not touch it.
    armed: bool,
}

impl Lease {
    pub fn new(qseg: Arc<Segment>, at: TableAt, idx: usize, gen: u64, party: u32) -> Self {
        Lease {
            qseg,
            at,
            idx,
            gen,
            party,
            pid: current_pid(),
            armed: true,
        }
    }

    /// The slot was handed to the ring (sent by reference): dropping this frees nothing.
    pub fn disarm(mut self) {
        self.armed = false;
    }

    /// The slot's index and generation.
    pub fn slot(&self) -> (usize, u64) {
        (self.idx, self.gen)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        // A forked child may drop copies of its parent's views: the slot stays the parent's.
        if current_pid() != self.pid || !self.armed {
            return;
        }
        // SAFETY: `at` holds the offsets of the queue header's ShmLock, closed flag and
        // SlotTable inside `qseg` (fixed by the layout, checked at attach); the mapping lives
        // as long as `qseg`.
        let (lock, closed, table) = unsafe {
            let base = self.qseg.as_ptr();
            (
                &*(base.add(self.at.lock) as *const ShmLock),
                &*(base.add(self.at.closed) as *const AtomicU32),
                &*(base.add(self.at.table) as *const SlotTable),
            )
        };
        // One compare-and-swap: dropping a view never waits, whoever holds the lock.
        table.give_back(self.idx, self.gen, self.party);
        if closed.load(Ordering::Acquire) != 0 {
            // Closed: no message will need the segment again; unlink it now if the lock is
            // free (else the owner's drop or a sweep does).
            if let Some(_g) = lock.try_lock(self.party) {
                table.evict_free(self.qseg.name());
            }
        }
    }
}

/// The memory of a large message: a slot's segment (with the lease that frees the slot) or a
/// one-shot segment. Zero-copy views hold it through an `Arc`.
#[derive(Debug)]
pub struct SideBuf {
    seg: Arc<Segment>,
    lease: Option<Lease>,
}

impl SideBuf {
    pub fn new(seg: Arc<Segment>, lease: Option<Lease>) -> Self {
        // Views must survive a fork unchanged (see crate::forkviews).
        crate::forkviews::register(seg.as_ptr(), seg.len());
        SideBuf { seg, lease }
    }

    /// Whether this is a pooled slot (freed for reuse when dropped) rather than a one-shot
    /// segment.
    pub fn pooled(&self) -> bool {
        self.lease.is_some()
    }

    /// Base address of the message body.
    pub fn as_ptr(&self) -> *mut u8 {
        self.seg.as_ptr()
    }

    /// Bytes mapped (at least the body).
    pub fn len(&self) -> usize {
        self.seg.len()
    }

    /// Never true: a segment has at least one byte.
    pub fn is_empty(&self) -> bool {
        self.seg.is_empty()
    }

    /// The segment's name.
    pub fn name(&self) -> &str {
        self.seg.name()
    }
}

impl Drop for SideBuf {
    fn drop(&mut self) {
        crate::forkviews::unregister(self.seg.as_ptr());
    }
}

/// A mapping of one generation of a slot, made in one fork epoch (a mapping that views made
/// private before a fork no longer reaches the shared segment: see crate::forkviews).
type Mapped = Option<(u64, u64, Arc<Segment>)>;

/// This process's mappings of slot segments, so a slot is mapped once, not per message.
pub struct SlotMaps {
    maps: Mutex<Vec<Mapped>>,
}

impl Default for SlotMaps {
    fn default() -> Self {
        SlotMaps {
            maps: Mutex::new(vec![None; SLOTS]),
        }
    }
}

impl SlotMaps {
    /// The mapping of slot `t`: cached, else created (fresh slots) or attached by name.
    /// Cached mappings of generations the table no longer has (evicted or discarded slots)
    /// are dropped on the way, so that evicted segments do not stay mapped in every process
    /// (their memory is freed once the last mapping goes): views still holding one keep it.
    /// The name's key is the table's [`SlotTable::name_key`].
    pub fn get(&self, queue: &str, table: &SlotTable, t: Taken) -> Result<Arc<Segment>> {
        let map = || -> Result<Arc<Segment>> {
            let name = slot_name(queue, table.name_key(), t.idx, t.gen);
            let seg = if t.fresh {
                let seg = Segment::create_named(&name, t.size as usize)?;
                // The queue's owner unlinks slot segments, not whoever made them.
                seg.forget_name();
                seg
            } else {
                Segment::attach(&name)?
            };
            if (seg.len() as u64) < t.size {
                return Err(CoreError::BadSegment(format!(
                    "{name} is smaller than its slot"
                )));
            }
            Ok(Arc::new(seg))
        };
        // A fork taken while another thread held this mutex leaves it locked forever in the
        // child: after a while without it, map without the cache rather than hang.
        let start = Instant::now();
        let mut guard = loop {
            match self.maps.try_lock() {
                Ok(g) => break g,
                Err(TryLockError::Poisoned(p)) => break p.into_inner(),
                Err(TryLockError::WouldBlock) if start.elapsed() < Duration::from_millis(500) => {
                    std::thread::yield_now()
                }
                Err(TryLockError::WouldBlock) => return map(),
            }
        };
        for (i, m) in guard.iter_mut().enumerate() {
            if let Some((gen, _, _)) = m {
                let s = table.slot(i);
                if s.state() == EMPTY || s.gen.load(Ordering::Relaxed) != *gen {
                    *m = None;
                }
            }
        }
        let epoch = crate::forkviews::epoch();
        if let Some((gen, at, seg)) = &guard[t.idx] {
            if *gen == t.gen && *at == epoch {
                return Ok(seg.clone());
            }
        }
        let seg = map()?;
        guard[t.idx] = Some((t.gen, epoch, seg.clone()));
        Ok(seg)
    }
}

impl SlotMaps {
    /// The (index, generation) of every cached mapping (tests).
    #[cfg(test)]
    pub fn cached(&self) -> Vec<(usize, u64)> {
        let g = self.maps.lock().unwrap();
        g.iter()
            .enumerate()
            .filter_map(|(i, m)| m.as_ref().map(|(gen, _, _)| (i, *gen)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_sizes_round_up_a_little() {
        assert_eq!(slot_size(1), 4096);
        assert_eq!(slot_size(4096), 4096);
        assert_eq!(slot_size(100_000), 13 * 8192);
        let sixteen = 16 << 20;
        let s = slot_size(sixteen + 200);
        assert!(
            s >= sixteen + 200 && s <= sixteen + sixteen / 16 + 4096,
            "{s}"
        );
        for len in [5000u64, 1 << 20, (1 << 20) + 1, 123_456_789] {
            let s = slot_size(len);
            assert!(
                s >= len && s % 4096 == 0 && s - len <= len / 16 + 4096,
                "{len} -> {s}"
            );
        }
    }

    #[test]
    fn slot_names_end_with_a_keyed_hash() {
        let q = "/ec.q0123456789abcdef.0011223344556677";
        let a = slot_name(q, 1, 3, 7);
        assert!(a.starts_with(&format!("{q}.3.7.")), "{a}");
        assert_eq!(a.rsplit('.').next().unwrap().len(), 16);
        assert_eq!(a, slot_name(q, 1, 3, 7), "the same for every process");
        assert_ne!(a, slot_name(q, 2, 3, 7), "another key, another name");
        assert_ne!(a, slot_name(q, 1, 3, 8));
        assert_ne!(a, slot_name(q, 1, 4, 7));
    }
}
