//! The queue's shared-memory layout: the header, the record header, record states and the
//! body layout. Everything here is `#[repr(C)]` and made of atomics, so any process that maps
//! the segment may read it; who may *write* each field is written beside it.
//!
//! ```text
//! Shared-memory layout, version 8 (offsets from the segment start)
//! [0, 24576)                   Header: magic "easyqueu", version, owner identity, sizes, the
//!                              lock, positions, counters, wake words, the party table
//!                              (1024 parties, queue::parties) and the slot table (crate::slots)
//! [24576, 24576 + ring_size)   ring of records; ring_size is a multiple of 64
//! record at (pos % ring_size), 64-byte aligned:
//!   [0, 64)    RecordHeader
//!   [64, ...)  inline body:  nparts x u64 part lengths, padded to 64, then each part padded to 64
//!              side record:  the side segment's name (name_len bytes); the side segment holds
//!                            the same body layout from its offset 0
//!              slot record:  no body; `slot`/`slot_gen` name the pooled segment holding it
//!   refs (FLAG_REFS, with any of the above): the last `refs_bytes(n)` bytes of the record
//!              are its reference table, n = flags >> 16 entries of 32 bytes
//!              (part u32, slot u32, slot_gen u64, offset u64, len u64), written under the
//!              lock before `head` is published: part `part` of the message is not in the
//!              body (its length there is 0) but `len` bytes at `offset` of the pooled slot
//!              `slot` (sent by reference, crate::slots)
//! A record that would not fit before the end of the ring is preceded by a PAD record filling
//! the rest of the ring.
//! ```

use super::parties::PartyTable;
use crate::shmlock::ShmLock;
use crate::slots::SlotTable;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// "easyqueu" in ASCII.
pub const MAGIC: u64 = 0x6561_7379_7175_6575;
/// Layout version; bumped on any change of the shared layout (5: 1024 parties with
/// generations, tokens in the lock word, record state words stamped with their position;
/// 6: the last reader to fall asleep, `last_reader`; 7: each slot's `filled_at`, which was
/// reserved; 8: a spinning reader's claim, `reader_spin_until`).
pub const VERSION: u32 = 8;
pub(crate) const HEADER_BYTES: usize = 6 * 4096;
pub(crate) const ALIGN: u64 = 64;
pub(crate) const REC_BYTES: u64 = 64;

// Record states. A record's state word is the one field that changes after the record is
// published (head moved past it); every change is one atomic operation by the one party
// allowed to make it, or a repair by the lock holder after that party was judged dead. The
// word carries the record's position stamp beside the state ([`RecordHeader::tag`]), and the
// changes a party makes without the lock (commit, release) are compare-and-swaps from the
// state it left, stamped with its own record's position: a party wrongly judged dead, whose
// record repair abandoned (or whose ring space was since reused), fails its compare-and-swap
// and is told so, instead of overwriting the repair or another record.
/// Reserved; its writer (party in `owner`) is copying the body. Written under the lock.
pub(crate) const ST_WRITING: u32 = 1;
/// Committed by its writer (no lock); may be claimed.
pub(crate) const ST_READY: u32 = 2;
/// Claimed by the reader in `owner` (under the lock); it alone may mark it DONE.
pub(crate) const ST_READING: u32 = 3;
/// Released by its reader (no lock needed); its space is freed when the tail passes it.
pub(crate) const ST_DONE: u32 = 4;
/// Filler up to the ring's end (under the lock).
pub(crate) const ST_PAD: u32 = 5;
/// Given up (its writer or reader died, or its side segment was lost); skipped by readers.
pub(crate) const ST_ABANDONED: u32 = 6;

/// The body is in a one-shot side segment whose name follows the record header.
pub(crate) const FLAG_SIDE: u32 = 1;
/// The body is in a pooled side segment: slot `slot`, generation `slot_gen` ([`crate::slots`]).
pub(crate) const FLAG_SLOT: u32 = 2;

/// Some parts travel by reference in pooled slots: the record ends with its reference table
/// of `flags >> REFS_SHIFT` entries ([`RefEntry`]).
pub(crate) const FLAG_REFS: u32 = 4;
/// The count of reference entries sits in the high bits of `flags`.
pub(crate) const REFS_SHIFT: u32 = 16;
/// Most parts one message may send by reference (the rest are copied).
pub const MAX_REFS: usize = 64;

/// One entry of a record's reference table: part `part` of the message is `len` bytes at
/// `offset` in pooled slot `slot` of generation `gen`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RefEntry {
    pub part: u32,
    pub slot: u32,
    pub gen: u64,
    pub offset: u64,
    pub len: u64,
}

/// Bytes of a reference table of `n` entries (32 bytes each, padded to 64).
pub(crate) fn refs_bytes(n: usize) -> u64 {
    align_up(n as u64 * 32, ALIGN)
}

/// Entries in a record's reference table (0 for records without FLAG_REFS).
pub(crate) fn refs_count(rec: &RecordHeader) -> usize {
    let flags = rec.flags.load(Ordering::Relaxed);
    if flags & FLAG_REFS == 0 {
        0
    } else {
        ((flags >> REFS_SHIFT) as usize).min(MAX_REFS)
    }
}

/// Writes a reference table at `at`.
///
/// # Safety
/// `at` must point at `refs_bytes(refs.len())` writable bytes that no one else touches.
pub(crate) unsafe fn write_refs(at: *mut u8, refs: &[RefEntry]) {
    for (k, r) in refs.iter().enumerate() {
        let w = [
            u64::from(r.part) | (u64::from(r.slot) << 32),
            r.gen,
            r.offset,
            r.len,
        ];
        // SAFETY: entry k lies inside the table (caller's contract).
        unsafe { std::ptr::copy_nonoverlapping(w.as_ptr() as *const u8, at.add(k * 32), 32) };
    }
}

/// Reads a reference table of `n` entries at `at`.
///
/// # Safety
/// `at` must point at `refs_bytes(n)` readable bytes.
pub(crate) unsafe fn read_refs(at: *const u8, n: usize) -> Vec<RefEntry> {
    (0..n)
        .map(|k| {
            let mut w = [0u64; 4];
            // SAFETY: entry k lies inside the table (caller's contract).
            unsafe { std::ptr::copy_nonoverlapping(at.add(k * 32), w.as_mut_ptr() as *mut u8, 32) };
            RefEntry {
                part: w[0] as u32,
                slot: (w[0] >> 32) as u32,
                gen: w[1],
                offset: w[2],
                len: w[3],
            }
        })
        .collect()
}

/// One word on its own cache lines, so that writers and readers do not false-share.
#[repr(C, align(128))]
pub(crate) struct Padded<T>(pub T);

/// The queue's control block, at offset 0 of the segment.
///
/// Positions are monotonic byte counts (`pos % ring_size` is the offset in the ring).
/// Invariant (whenever the lock is free): `tail <= read <= head`, each at a record boundary;
/// every record in `[tail, head)` has a complete header. The counters below are *derived*
/// from the records in `[tail, head)`: a holder that dies halfway through an update may leave
/// them wrong, and whoever takes the lock over rebuilds them from the ring
/// (`recover::repair`), so nothing else needs to be ordered for crash safety.
#[repr(C)]
pub(crate) struct Header {
    /// [`MAGIC`], written last at creation: an attacher that sees it sees a ready queue.
    pub magic: AtomicU64,
    /// [`VERSION`].
    pub version: AtomicU32,
    _pad0: u32,
    /// The creator's identity (packed, [`crate::liveness::Identity`]): owner of the segment's
    /// name and of the names of its side segments.
    pub owner: AtomicU64,
    /// Bytes in the ring (multiple of 64). Fixed at creation.
    pub ring_size: AtomicU64,
    /// At most this many messages are in the queue (reserved and not yet released). Fixed.
    pub max_msgs: AtomicU64,
    /// Records larger than this go to a side segment. Fixed.
    pub max_inline: AtomicU64,
    /// At most this many bytes of side segments are in flight, unless the queue holds none.
    pub side_budget: AtomicU64,
    /// Bodies of at least this many bytes go to a pooled slot when one can be had. Fixed.
    pub pool_min: AtomicU64,
    /// 1 once closed (never reset).
    pub closed: AtomicU32,
    /// Guards the positions, the derived counters, the party table's frees and the slot table.
    pub lock: Padded<ShmLock>,
    /// Under the lock: next byte to reserve. Published last by a reservation.
    pub head: AtomicU64,
    /// Under the lock: next record to claim. Records before it were claimed (or skipped).
    pub read: AtomicU64,
    /// Under the lock: oldest byte not yet freed. Records before it are free space.
    pub tail: AtomicU64,
    /// Derived, under the lock: non-PAD records in `[tail, head)`.
    pub n_msgs: AtomicU64,
    /// Derived, under the lock: non-PAD records in `[read, head)` (the queue's length).
    pub pending: AtomicU64,
    /// Derived, under the lock: body bytes of side and slot records in `[tail, head)`.
    pub side_bytes: AtomicU64,
    /// Bumped by every commit and by close; readers sleep on it.
    pub data_seq: Padded<AtomicU32>,
    /// Readers asleep (a hint: the sum of the live parties' counts, rebuilt by repair).
    pub readers_waiting: AtomicU32,
    /// The party (1-based; 0: none) of the reader that fell asleep last, written by that
    /// reader before it sleeps and cleared by it (if still its own) when it wakes. A hint:
    /// a commit wakes this reader first, whose caches are warm from the message before
    /// (a request/response loop keeps one hot worker, where the futex alone wakes the
    /// sleepers in turn); any value is safe, as a wake that finds no such sleeper falls
    /// back to waking any reader.
    pub last_reader: AtomicU32,
    /// A spinning reader's claim on the next commit (`queue::spinners`): the
    /// CLOCK_MONOTONIC nanosecond at which its spin ends (0: none). Written by that reader as
    /// it starts to spin, and set back to 0 by it when the spin ends (if still its own) or by
    /// the first writer to commit meanwhile, which then wakes one sleeping reader fewer. A
    /// hint, trusted only while it lies in the future by at most `spinners::CLAIM_MAX`: a
    /// claim left by a reader that died or stalled runs out by itself, and any value costs
    /// at most one commit a recovery tick of a sleeper's time.
    pub reader_spin_until: AtomicU64,
    /// Bumped by every release and by close; writers sleep on it.
    pub space_seq: Padded<AtomicU32>,
    /// Writers asleep (a hint, as `readers_waiting`).
    pub writers_waiting: AtomicU32,
    /// Under the lock, statistics: messages and payload bytes put (counted when reserved).
    pub total_puts: Padded<AtomicU64>,
    pub total_bytes: AtomicU64,
    /// The processes using the queue (their identities and sleeping counts).
    pub parties: PartyTable,
    /// The pool of side segments for large messages.
    pub slots: SlotTable,
    /// When a waiter last started a dead-party scan (`recover`), in CLOCK_MONOTONIC
    /// nanoseconds (one clock for every process of the machine): waiters whose sleep ends
    /// without progress scan at most once a recovery tick *per queue*, not each once a tick
    /// (a pool of hundreds of idle workers probed every party's token hundreds of times a
    /// tick). A hint: any value is safe, at worst one scan too many or one tick late.
    pub last_scan: AtomicU64,
}

/// The header of one record in the ring. Written by its reserver under the lock before `head`
/// is published; afterwards only the state in `tag` (and `owner` with it) changes.
#[repr(C)]
pub(crate) struct RecordHeader {
    /// `stamp << 3 | state`, where stamp is the record's position / 64 (unique for ever:
    /// positions only grow). Invariant: for a record at position `pos` in `[tail, head)`,
    /// the stamp is `pos / 64`. Written with the record's state at reservation (under the
    /// lock); afterwards changed only by the transitions listed with the `ST_*` constants,
    /// the lock-free ones (commit WRITING -> READY, release READING -> DONE) by a
    /// compare-and-swap on the whole word.
    pub tag: AtomicU64,
    /// The token (`queue::parties`) of the writer (WRITING) or of the reader (READING).
    pub owner: AtomicU32,
    pub kind: AtomicU32,
    pub nparts: AtomicU32,
    /// side records: length of the side segment's name stored after the header
    pub name_len: AtomicU32,
    pub seq: AtomicU64,
    /// bytes this record takes in the ring, header included (multiple of 64, at least 64)
    pub size: AtomicU64,
    /// bytes of body: inline, after the header; side, the side segment's length
    pub body_len: AtomicU64,
    /// FLAG_* bits; with FLAG_REFS, the reference table's length in the bits from REFS_SHIFT.
    pub flags: AtomicU32,
    /// slot records: the slot's index and generation
    pub slot: AtomicU32,
    pub slot_gen: AtomicU64,
}

const STATE_BITS: u32 = 3;
const STATE_MASK: u64 = (1 << STATE_BITS) - 1;

/// The state word of the record at `pos` in state `st`.
pub(crate) fn tag(pos: u64, st: u32) -> u64 {
    ((pos / ALIGN) << STATE_BITS) | u64::from(st)
}

impl RecordHeader {
    /// The record's state (ST_*).
    pub fn state(&self) -> u32 {
        (self.tag.load(Ordering::Acquire) & STATE_MASK) as u32
    }

    /// Sets the state of the record at `pos` (under the lock, or by its reserver).
    pub fn set_state(&self, pos: u64, st: u32) {
        self.tag.store(tag(pos, st), Ordering::Release);
    }

    /// Changes the state of the record at `pos` from `from` to `to` if it is still that
    /// record in that state; false if repair (or a reuse of its space) got there first.
    pub fn change(&self, pos: u64, from: u32, to: u32) -> bool {
        self.tag
            .compare_exchange(
                tag(pos, from),
                tag(pos, to),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
    }

    /// Whether the state word is stamped with position `pos` (a record written there).
    pub fn stamped(&self, pos: u64) -> bool {
        self.tag.load(Ordering::Acquire) >> STATE_BITS == (pos / ALIGN) & (u64::MAX >> STATE_BITS)
    }
}

const _: () = assert!(std::mem::size_of::<RecordHeader>() == REC_BYTES as usize);
const _: () = assert!(std::mem::size_of::<Header>() <= HEADER_BYTES);

/// `a += d` for a word changed only under the queue lock: a plain load and store, cheaper
/// than a locked read-modify-write instruction.
pub(crate) fn locked_add(a: &AtomicU64, d: u64) {
    a.store(a.load(Ordering::Relaxed).wrapping_add(d), Ordering::Relaxed);
}

/// `a -= d` for a word changed only under the queue lock (see [`locked_add`]).
pub(crate) fn locked_sub(a: &AtomicU64, d: u64) {
    a.store(a.load(Ordering::Relaxed).wrapping_sub(d), Ordering::Relaxed);
}

pub(crate) fn align_up(n: u64, a: u64) -> u64 {
    n.div_ceil(a) * a
}

/// The body layout: a table of `nparts` u64 lengths padded to 64 bytes, then each part padded
/// to 64. Calls `each(offset, len)` for every part and returns the body's total length.
pub(crate) fn body_layout(
    lens: impl ExactSizeIterator<Item = u64>,
    mut each: impl FnMut(u64, u64),
) -> u64 {
    let mut off = align_up(lens.len() as u64 * 8, ALIGN);
    for l in lens {
        each(off, l);
        off = align_up(off.saturating_add(l), ALIGN);
    }
    off
}

/// Bytes of body for these parts.
pub fn body_len(parts: &[&[u8]]) -> u64 {
    body_layout(parts.iter().map(|p| p.len() as u64), |_, _| {})
}

/// Reads a body's part table at `base` (`nparts` u64 lengths) and checks it against the
/// body's length: the `(offset, len)` of each part, or `None` if the table does not describe
/// a body of at most `body` bytes (a corrupt or foreign segment).
///
/// # Safety
/// `base` must point at `body` readable bytes.
pub(crate) unsafe fn read_part_table(
    base: *const u8,
    nparts: usize,
    body: u64,
) -> Option<Vec<(u64, u64)>> {
    if align_up(nparts as u64 * 8, ALIGN) > body {
        return None;
    }
    // SAFETY: the table (nparts u64 lengths) lies inside the body, checked just above.
    let lens = (0..nparts).map(|k| unsafe { (base as *const u64).add(k).read_unaligned() });
    let mut out = Vec::with_capacity(nparts);
    let total = body_layout(lens, |off, len| out.push((off, len)));
    (total <= body
        && out
            .iter()
            .all(|&(o, l)| o.checked_add(l).is_some_and(|e| e <= body)))
    .then_some(out)
}

/// Writes the body of `parts` at `base`; with `stream`, the parts by streaming stores
/// ([`crate::copy`]: a destination out of the caches).
///
/// # Safety
/// `base` must point at `body_len(parts)` writable bytes that no one else touches.
pub(crate) unsafe fn write_body(base: *mut u8, parts: &[&[u8]], stream: bool) {
    let mut k = 0;
    body_layout(parts.iter().map(|p| p.len() as u64), |off, len| {
        let p = parts[k];
        // SAFETY: `base` points at a body reserved for exactly this layout (caller's contract).
        unsafe {
            (base as *mut u64).add(k).write_unaligned(len);
            crate::copy::copy(base.add(off as usize), p.as_ptr(), p.len(), stream);
        }
        k += 1;
    });
}
