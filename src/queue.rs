//! A bounded multi-producer multi-consumer message queue in one shared-memory segment.
//!
//! Each message carries a sequence number, a kind tag and a payload made of *parts* (byte
//! strings written one after another, each 64-byte aligned), so a pickle stream and its
//! protocol-5 out-of-band buffers travel without being joined first.
//!
//! # Algorithm
//! A byte ring of variable-size *records*, in the spirit of a reserve/commit ring buffer
//! (as in Linux's BPF ring buffer and LMAX-style disruptors), with three monotonic positions:
//! `tail <= read <= head`. A writer *reserves* `[head, head+size)` under a short lock, copies its
//! parts with no lock held, then *commits* by storing `READY` into the record's state word. A
//! reader *claims* committed records at `read` in FIFO order under the lock, copies them out with
//! no lock held, then *releases* them; `tail` advances over released records, which frees ring
//! space. A small message read one per call is instead *taken* ([`Queue::take_small`]): copied
//! and released under a single hold of the lock, which saves a lock round trip between cores.
//! Messages whose record would exceed `max_inline` bytes go to a *side segment* and the
//! ring holds only a reference to it; the reader maps it and hands out zero-copy views, so a
//! message larger than the ring never stalls the queue. Side segments come from a pool of
//! reusable *slots* ([`crate::slots`]), or, when the pool has none to give, are made for the
//! one message (*one-shot*) and unlinked by the reader.
//!
//! # Robustness: the lock and dead processes
//! The lock ([`PidLock`]) holds the pid of its holder; it guards only a few stores of positions
//! and counters, never a copy or a wait. A process that dies holding it (SIGKILL) is detected by
//! waiters and the lock is taken over; every update under the lock is ordered so that any
//! prefix of it leaves the ring consistent. A record left `WRITING` or `READING` by a dead process is marked `ABANDONED` by
//! the next waiter whose wait times out ([`Queue::recover`]), its side segment unlinked, and the
//! ring moves on; a slot held by a dead process is discarded. So no process can leave the
//! others blocked forever.
//!
//! # Waiting
//! Blocked readers wait on the futex word `data_seq`, bumped by every commit and by close;
//! blocked writers on `space_seq`, bumped by every release and by close. Each side first spins
//! for a few microseconds (most waits are short when both sides are busy), and the other side
//! issues a wake system call only when someone is actually asleep.
//!
//! # Shared-memory layout (version 2), offsets from the segment start
//! ```text
//! [0, 4096)                    Header (#[repr(C)]; hot words on their own 128-byte lines; it
//!                              ends with the slot table of crate::slots)
//! [4096, 4096 + ring_size)     ring of records; ring_size is a multiple of 64
//! record at (pos % ring_size), 64-byte aligned:
//!   [0, 64)    RecordHeader (#[repr(C)])
//!   [64, ...)  inline body:  nparts x u64 part lengths, padded to 64, then each part padded to 64
//!              side record:  the side segment's name (name_len bytes); the side segment holds
//!                            the same body layout from its offset 0
//!              slot record:  no body; `slot`/`slot_gen` name the pooled segment holding it
//! A record that would not fit before the end of the ring is preceded by a PAD record filling
//! the rest of the ring.
//! ```

use crate::error::{CoreError, Result};
use crate::pidlock::{PidLock, PidLockGuard};
use crate::shm::Segment;
use crate::slots::{Lease, SideBuf, SlotMaps, SlotTable, TableAt, Taken};
use crate::wait::{self, current_pid, pid_alive};
use crossbeam_utils::Backoff;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// "easyqueu" in ASCII.
pub const MAGIC: u64 = 0x6561_7379_7175_6575;
/// Layout version; bumped on any change of the shared layout.
pub const VERSION: u32 = 2;
const HEADER_BYTES: usize = 4096;
const ALIGN: u64 = 64;
const REC_BYTES: u64 = 64;
/// A waiter that sleeps this long without progress checks for dead processes.
const RECOVER_TICK: Duration = Duration::from_millis(50);
/// Default [`QueueConfig::pool_min`]: copying this much costs more than leasing a slot.
const DEFAULT_POOL_MIN: u64 = 256 << 10;

// Record states.
const ST_WRITING: u32 = 1;
const ST_READY: u32 = 2;
const ST_READING: u32 = 3;
const ST_DONE: u32 = 4;
const ST_PAD: u32 = 5;
const ST_ABANDONED: u32 = 6;

/// The body is in a one-shot side segment whose name follows the record header.
const FLAG_SIDE: u32 = 1;
/// The body is in a pooled side segment: slot `slot`, generation `slot_gen` ([`crate::slots`]).
const FLAG_SLOT: u32 = 2;

/// One word on its own cache lines, so that writers and readers do not false-share.
#[repr(C, align(128))]
struct Padded<T>(T);

/// The queue's control block, at offset 0 of the segment.
#[repr(C)]
struct Header {
    /// [`MAGIC`], written last at creation: an attacher that sees it sees a ready queue.
    magic: AtomicU64,
    /// [`VERSION`].
    version: AtomicU32,
    /// pid of the creating process (owner of the segment name and of side-segment names).
    owner_pid: AtomicU32,
    /// Bytes in the ring (multiple of 64).
    ring_size: AtomicU64,
    /// At most this many messages are in the queue (reserved and not yet released).
    max_msgs: AtomicU64,
    /// Records larger than this go to a side segment.
    max_inline: AtomicU64,
    /// At most this many bytes of side segments are in flight, unless the queue holds none.
    side_budget: AtomicU64,
    /// Bodies of at least this many bytes go to a pooled slot when one can be had.
    pool_min: AtomicU64,
    /// 1 once closed.
    closed: AtomicU32,
    /// Guards the positions, the counters below and the slot table.
    lock: Padded<PidLock>,
    /// Under the lock: next byte to reserve.
    head: AtomicU64,
    /// Under the lock: next record to claim.
    read: AtomicU64,
    /// Under the lock: oldest byte not yet released.
    tail: AtomicU64,
    /// Under the lock: messages reserved and not yet released.
    n_msgs: AtomicU64,
    /// Under the lock: messages reserved and not yet claimed (the queue's visible length).
    pending: AtomicU64,
    /// Under the lock: side-segment bytes reserved and not yet released.
    side_bytes: AtomicU64,
    /// Bumped by every commit and by close; readers sleep on it.
    data_seq: Padded<AtomicU32>,
    readers_waiting: AtomicU32,
    /// Bumped by every release and by close; writers sleep on it.
    space_seq: Padded<AtomicU32>,
    writers_waiting: AtomicU32,
    /// Under the lock, statistics: messages and payload bytes put (counted when reserved).
    total_puts: Padded<AtomicU64>,
    total_bytes: AtomicU64,
    /// The pool of side segments for large messages.
    slots: SlotTable,
}

/// The header of one record in the ring.
#[repr(C)]
struct RecordHeader {
    state: AtomicU32,
    /// pid of the writer (WRITING) or of the reader (READING).
    owner: AtomicU32,
    kind: AtomicU32,
    nparts: AtomicU32,
    seq: AtomicU64,
    /// bytes this record takes in the ring, header included (multiple of 64)
    size: AtomicU64,
    /// bytes of body: inline, after the header; side, the side segment's length
    body_len: AtomicU64,
    flags: AtomicU32,
    /// side records: length of the side segment's name stored after the header
    name_len: AtomicU32,
    /// slot records: the slot's index and generation
    slot: AtomicU64,
    slot_gen: AtomicU64,
}

const _: () = assert!(std::mem::size_of::<RecordHeader>() == REC_BYTES as usize);
const _: () = assert!(std::mem::size_of::<Header>() <= HEADER_BYTES);

/// `a += d` for a word changed only under the queue lock: a plain load and store, cheaper
/// than a locked read-modify-write instruction.
fn locked_add(a: &AtomicU64, d: u64) {
    a.store(a.load(Ordering::Relaxed).wrapping_add(d), Ordering::Relaxed);
}

/// `a -= d` for a word changed only under the queue lock (see [`locked_add`]).
fn locked_sub(a: &AtomicU64, d: u64) {
    a.store(a.load(Ordering::Relaxed).wrapping_sub(d), Ordering::Relaxed);
}

fn align_up(n: u64, a: u64) -> u64 {
    n.div_ceil(a) * a
}

/// The body layout: a table of `nparts` u64 lengths padded to 64 bytes, then each part padded
/// to 64. Calls `each(offset, len)` for every part and returns the body's total length.
fn body_layout(lens: impl ExactSizeIterator<Item = u64>, mut each: impl FnMut(u64, u64)) -> u64 {
    let mut off = align_up(lens.len() as u64 * 8, ALIGN);
    for l in lens {
        each(off, l);
        off = align_up(off + l, ALIGN);
    }
    off
}

/// Bytes of body for these parts.
pub fn body_len(parts: &[&[u8]]) -> u64 {
    body_layout(parts.iter().map(|p| p.len() as u64), |_, _| {})
}

/// Sizes of a queue, chosen by its creator.
#[derive(Clone, Debug)]
pub struct QueueConfig {
    /// Bytes in the ring (rounded up to a multiple of 64, at least 4 KiB).
    pub ring_bytes: u64,
    /// Most messages in the queue at once.
    pub max_messages: u64,
    /// Largest record kept in the ring; larger messages use a side segment.
    /// Defaults to a quarter of the ring.
    pub max_inline: Option<u64>,
    /// Most side-segment bytes in flight (one message is always admitted when none is).
    /// Defaults to the ring size.
    pub side_budget: Option<u64>,
    /// Most bytes of pooled side segments kept for reuse (0: no pool, every large message
    /// gets a one-shot segment). Defaults to twice the side budget.
    pub pool_bytes: Option<u64>,
    /// Messages whose body has at least this many bytes travel in a pooled slot (read
    /// zero-copy) when the pool has one to give, else inline if they fit, else in a one-shot
    /// segment. Defaults to 256 KiB (at most `max_inline`).
    pub pool_min: Option<u64>,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            ring_bytes: 64 << 20,
            max_messages: 1 << 16,
            max_inline: None,
            side_budget: None,
            pool_bytes: None,
            pool_min: None,
        }
    }
}

/// A handle on a queue; every process holds its own (created, or attached by name).
pub struct Queue {
    seg: Arc<Segment>,
    ring_size: u64,
    spin: Duration,
    /// This process's mappings of slot segments.
    maps: SlotMaps,
}

/// A claimed message: its record stays reserved until [`Queue::release`].
#[derive(Debug)]
pub struct Claimed {
    pos: u64,
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
    released: bool,
}

/// Most messages [`Queue::try_put_many`] reserves under one lock hold.
pub const PUT_BATCH: usize = 64;

/// Most parts a message may have for [`Queue::take_small`].
pub const SMALL_PARTS: usize = 4;

/// What [`Queue::take_small`] found.
#[derive(Debug)]
pub enum Small<R> {
    /// The next message, already released; what the callback made of it.
    Took(R),
    /// The next message is large or has many parts: [`Queue::claim`] it.
    NotSmall,
    /// No message is ready now.
    Empty,
}

/// Where a large message's body goes.
enum Side {
    Slot(Taken),
    /// A one-shot segment: its name and length.
    OneShot(String, u64),
}

/// Where a writer may copy its parts.
struct Reservation {
    pos: u64,
    side: Option<Side>,
}

impl Queue {
    /// Creates a queue in a new shared-memory segment owned by this process.
    pub fn create(cfg: &QueueConfig) -> Result<Queue> {
        let ring = align_up(cfg.ring_bytes.max(4096), ALIGN);
        if cfg.max_messages == 0 {
            return Err(CoreError::Invalid("max_messages must be at least 1".into()));
        }
        let max_inline = cfg
            .max_inline
            .unwrap_or(ring / 4)
            .clamp(REC_BYTES * 2, ring / 2);
        let seg = Segment::create(HEADER_BYTES + ring as usize, current_pid())?;
        let q = Queue {
            seg: Arc::new(seg),
            ring_size: ring,
            spin: Duration::from_micros(20),
            maps: SlotMaps::default(),
        };
        let h = q.hdr();
        h.version.store(VERSION, Ordering::Relaxed);
        h.owner_pid.store(current_pid(), Ordering::Relaxed);
        h.ring_size.store(ring, Ordering::Relaxed);
        h.max_msgs.store(cfg.max_messages, Ordering::Relaxed);
        h.max_inline.store(max_inline, Ordering::Relaxed);
        let side_budget = cfg.side_budget.unwrap_or(ring).max(1);
        h.side_budget.store(side_budget, Ordering::Relaxed);
        h.slots
            .init(cfg.pool_bytes.unwrap_or(side_budget.saturating_mul(2)));
        h.pool_min.store(
            cfg.pool_min.unwrap_or(DEFAULT_POOL_MIN.min(max_inline)),
            Ordering::Relaxed,
        );
        h.magic.store(MAGIC, Ordering::Release);
        Ok(q)
    }

    /// Attaches to a queue created by another process (or this one) by its segment name.
    pub fn attach(name: &str) -> Result<Queue> {
        let seg = Segment::attach(name)?;
        if seg.len() < HEADER_BYTES + 4096 {
            return Err(CoreError::BadSegment(format!(
                "{name} is too small for a queue"
            )));
        }
        // SAFETY: the segment is at least HEADER_BYTES long and page aligned.
        let h = unsafe { &*(seg.as_ptr() as *const Header) };
        if h.magic.load(Ordering::Acquire) != MAGIC || h.version.load(Ordering::Relaxed) != VERSION
        {
            return Err(CoreError::BadSegment(format!(
                "{name} is not an easycore queue of layout version {VERSION}"
            )));
        }
        let ring = h.ring_size.load(Ordering::Relaxed);
        if HEADER_BYTES as u64 + ring > seg.len() as u64 {
            return Err(CoreError::BadSegment(format!(
                "{name}: ring larger than segment"
            )));
        }
        Ok(Queue {
            seg: Arc::new(seg),
            ring_size: ring,
            spin: Duration::from_micros(20),
            maps: SlotMaps::default(),
        })
    }

    /// Sets how long a blocked call spins before it sleeps (this handle only).
    pub fn set_spin(&mut self, spin: Duration) {
        self.spin = spin;
    }

    fn hdr(&self) -> &Header {
        // SAFETY: the segment starts with a Header (checked at attach, written at create); it is
        // page aligned and lives as long as `self`. All fields are atomics.
        unsafe { &*(self.seg.as_ptr() as *const Header) }
    }

    fn ring_ptr(&self) -> *mut u8 {
        // SAFETY: HEADER_BYTES < segment length (checked at create/attach).
        unsafe { self.seg.as_ptr().add(HEADER_BYTES) }
    }

    fn rec(&self, pos: u64) -> &RecordHeader {
        let off = pos % self.ring_size;
        debug_assert!(off % ALIGN == 0 && off + REC_BYTES <= self.ring_size);
        // SAFETY: records start at 64-aligned offsets inside the ring and a whole header always
        // fits before the ring's end (ring size is a multiple of 64); fields are atomics.
        unsafe { &*(self.ring_ptr().add(off as usize) as *const RecordHeader) }
    }

    fn body_ptr(&self, pos: u64) -> *mut u8 {
        // SAFETY: a record's body follows its header inside the ring (reserve never splits a
        // record across the ring's end).
        unsafe {
            self.ring_ptr()
                .add((pos % self.ring_size + REC_BYTES) as usize)
        }
    }

    /// The segment's name: pass it to [`Queue::attach`] in another process.
    pub fn name(&self) -> &str {
        self.seg.name()
    }

    /// Removes the segment's name once every party has attached (memory stays mapped).
    pub fn unlink(&self) -> Result<()> {
        self.seg.unlink()
    }

    /// Ring size in bytes.
    pub fn ring_size(&self) -> u64 {
        self.ring_size
    }

    /// Largest record kept inline.
    pub fn max_inline(&self) -> u64 {
        self.hdr().max_inline.load(Ordering::Relaxed)
    }

    /// Most messages at once.
    pub fn max_messages(&self) -> u64 {
        self.hdr().max_msgs.load(Ordering::Relaxed)
    }

    /// Messages put and not yet claimed.
    pub fn len(&self) -> u64 {
        self.hdr().pending.load(Ordering::Relaxed)
    }

    /// Whether no message waits to be claimed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Messages and payload bytes put since creation.
    pub fn totals(&self) -> (u64, u64) {
        let h = self.hdr();
        (
            h.total_puts.0.load(Ordering::Relaxed),
            h.total_bytes.load(Ordering::Relaxed),
        )
    }

    /// Closes the queue: every blocked put and get wakes; puts fail from now on, gets fail once
    /// the queue is drained.
    pub fn close(&self) {
        let h = self.hdr();
        h.closed.store(1, Ordering::SeqCst);
        h.data_seq.0.fetch_add(1, Ordering::SeqCst);
        h.space_seq.0.fetch_add(1, Ordering::SeqCst);
        wait::wake_all(&h.data_seq.0);
        wait::wake_all(&h.space_seq.0);
    }

    /// Whether [`Queue::close`] was called by anyone.
    pub fn is_closed(&self) -> bool {
        self.hdr().closed.load(Ordering::SeqCst) != 0
    }

    fn lock(&self) -> PidLockGuard<'_> {
        self.hdr().lock.0.lock()
    }

    /// Where a [`Lease`] finds the lock and the slot table in this queue's segment.
    fn table_at() -> TableAt {
        TableAt {
            lock: std::mem::offset_of!(Header, lock),
            table: std::mem::offset_of!(Header, slots),
        }
    }

    /// Bytes of pooled side segments that exist now, and the most the pool may keep.
    pub fn pool_bytes(&self) -> (u64, u64) {
        self.hdr().slots.bytes()
    }

    // ----- writing -----

    /// Reserves room for one message under the lock; `None` when it does not fit yet.
    fn try_reserve(
        &self,
        h: &Header,
        seq: u64,
        kind: u32,
        nparts: u32,
        body: u64,
    ) -> Option<Reservation> {
        if h.n_msgs.load(Ordering::Relaxed) >= h.max_msgs.load(Ordering::Relaxed) {
            return None;
        }
        let inline_need = align_up(REC_BYTES + body, ALIGN);
        let large = inline_need > h.max_inline.load(Ordering::Relaxed);
        let used = h.side_bytes.load(Ordering::Relaxed);
        let within_budget = used == 0 || used + body <= h.side_budget.load(Ordering::Relaxed);
        if large && !within_budget {
            return None;
        }
        let mut side = None;
        if within_budget && body >= h.pool_min.load(Ordering::Relaxed) {
            side = h.slots.take(self.name(), body).map(Side::Slot);
        }
        if side.is_none() && large {
            let name = crate::shm::new_name_for(h.owner_pid.load(Ordering::Relaxed));
            side = Some(Side::OneShot(name, body));
        }
        let need = match &side {
            None => inline_need,
            Some(Side::Slot(_)) => REC_BYTES,
            Some(Side::OneShot(name, _)) => align_up(REC_BYTES + name.len() as u64, ALIGN),
        };
        let mut head = h.head.load(Ordering::Relaxed);
        let mut tail = h.tail.load(Ordering::Relaxed);
        let r = self.ring_size;
        if head == tail && head % r != 0 {
            // Empty: restart at the ring's start so that any record up to half the ring fits.
            head = align_up(head, r);
            tail = head;
            h.tail.store(head, Ordering::Relaxed);
            h.read.store(head, Ordering::Relaxed);
            h.head.store(head, Ordering::Relaxed);
        }
        let off = head % r;
        let pad = if off + need > r { r - off } else { 0 };
        if head + pad + need - tail > r {
            if let Some(Side::Slot(t)) = side {
                h.slots.untake(t);
            }
            return None;
        }
        if pad > 0 {
            let p = self.rec(head);
            p.size.store(pad, Ordering::Relaxed);
            p.flags.store(0, Ordering::Relaxed);
            p.state.store(ST_PAD, Ordering::Release);
            head += pad;
            h.head.store(head, Ordering::Relaxed);
        }
        let rec = self.rec(head);
        rec.owner.store(current_pid(), Ordering::Relaxed);
        rec.state.store(ST_WRITING, Ordering::Release);
        rec.seq.store(seq, Ordering::Relaxed);
        rec.kind.store(kind, Ordering::Relaxed);
        rec.nparts.store(nparts, Ordering::Relaxed);
        rec.size.store(need, Ordering::Relaxed);
        rec.body_len.store(body, Ordering::Relaxed);
        rec.flags.store(0, Ordering::Relaxed);
        match &side {
            None => {}
            Some(Side::Slot(t)) => {
                rec.slot.store(t.idx as u64, Ordering::Relaxed);
                rec.slot_gen.store(t.gen, Ordering::Relaxed);
                rec.flags.store(FLAG_SLOT, Ordering::Relaxed);
            }
            Some(Side::OneShot(name, _)) => {
                rec.name_len.store(name.len() as u32, Ordering::Relaxed);
                // SAFETY: the record has `need >= 64 + name.len()` bytes reserved for us.
                unsafe {
                    std::ptr::copy_nonoverlapping(name.as_ptr(), self.body_ptr(head), name.len())
                };
                rec.flags.store(FLAG_SIDE, Ordering::Relaxed);
            }
        }
        if side.is_some() {
            locked_add(&h.side_bytes, body);
        }
        // Publish the reservation last, so a crash before this line leaves nothing reserved.
        h.head.store(head + need, Ordering::Relaxed);
        locked_add(&h.n_msgs, 1);
        locked_add(&h.pending, 1);
        Some(Reservation { pos: head, side })
    }

    /// Writes the parts of a reserved message and commits it (or abandons it on error).
    fn fill_and_commit(&self, res: Reservation, parts: &[&[u8]]) -> Result<()> {
        let rec = self.rec(res.pos);
        let h = self.hdr();
        let outcome = match &res.side {
            None => {
                write_body(self.body_ptr(res.pos), parts);
                Ok(())
            }
            Some(Side::Slot(t)) => match self.maps.get(self.name(), *t) {
                Ok(seg) => {
                    write_body(seg.as_ptr(), parts);
                    h.slots.hand_to_ring(t.idx);
                    Ok(())
                }
                Err(e) => {
                    let _g = self.lock();
                    h.slots.discard(self.name(), t.idx, t.gen);
                    Err(e)
                }
            },
            Some(Side::OneShot(name, len)) => {
                Segment::create_named(name, *len as usize).map(|seg| {
                    write_body(seg.as_ptr(), parts);
                    // The reader attaches by name; our handle must not unlink it on drop.
                    seg.forget_name();
                })
            }
        };
        rec.state.store(
            if outcome.is_ok() {
                ST_READY
            } else {
                ST_ABANDONED
            },
            Ordering::Release,
        );
        h.data_seq.0.fetch_add(1, Ordering::SeqCst);
        if h.readers_waiting.load(Ordering::SeqCst) > 0 {
            wait::wake_all(&h.data_seq.0);
        }
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
    pub fn put_many(
        &self,
        msgs: &[(u64, u32, &[&[u8]])],
        deadline: Option<Instant>,
    ) -> Result<usize> {
        let h = self.hdr();
        let mut done = 0;
        while done < msgs.len() {
            let seen = h.space_seq.0.load(Ordering::SeqCst);
            let n = self.try_put_many(&msgs[done..])?;
            done += n;
            if n > 0 {
                continue;
            }
            if !self.wait_for(&h.space_seq.0, &h.writers_waiting, seen, deadline) {
                return if done > 0 {
                    Ok(done)
                } else {
                    Err(CoreError::Full)
                };
            }
        }
        Ok(done)
    }

    /// Puts the first messages that fit now (up to [`PUT_BATCH`] under one lock hold), never
    /// waiting; returns how many. An error after some were reserved still commits (or
    /// abandons) every reserved record.
    pub fn try_put_many(&self, msgs: &[(u64, u32, &[&[u8]])]) -> Result<usize> {
        if msgs.len() == 1 {
            // The one-message call allocates nothing.
            return self.put_reserved(msgs, &mut [None]);
        }
        let mut batch: Vec<Option<Reservation>> = Vec::new();
        batch.resize_with(msgs.len().min(PUT_BATCH), || None);
        self.put_reserved(msgs, &mut batch)
    }

    /// Reserves the first messages that fit, one per entry of `batch`, under one lock hold;
    /// then fills and commits them. Returns how many.
    fn put_reserved(
        &self,
        msgs: &[(u64, u32, &[&[u8]])],
        batch: &mut [Option<Reservation>],
    ) -> Result<usize> {
        let h = self.hdr();
        let (mut n, mut bytes) = (0, 0);
        {
            let _g = self.lock();
            // Checked once per batch: a close racing the batch lets it through whole (readers
            // drain it), as if it had come just before; never half a batch left reserved.
            if h.closed.load(Ordering::SeqCst) != 0 {
                return Err(CoreError::Closed);
            }
            for (slot, (seq, kind, parts)) in batch.iter_mut().zip(msgs) {
                match self.try_reserve(h, *seq, *kind, parts.len() as u32, body_len(parts)) {
                    Some(r) => *slot = Some(r),
                    None => break,
                }
                n += 1;
                bytes += parts.iter().map(|p| p.len() as u64).sum::<u64>();
            }
            locked_add(&h.total_puts.0, n as u64);
            locked_add(&h.total_bytes, bytes);
        }
        let mut first_err = None;
        for (r, m) in batch.iter_mut().zip(msgs).take(n) {
            let r = r.take().expect("reserved above");
            if let Err(e) = self.fill_and_commit(r, m.2) {
                first_err.get_or_insert(e);
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(n),
        }
    }

    /// A stamp of the readers' wake-up word: read it *before* looking for a message, then
    /// pass it to [`Queue::wait_readable`] if none was there.
    pub fn data_stamp(&self) -> u32 {
        self.hdr().data_seq.0.load(Ordering::SeqCst)
    }

    /// Waits until a message is committed (or the queue closed) after `stamp` was taken, or
    /// until `deadline`; false if the deadline passed. Spins briefly first, then sleeps.
    pub fn wait_readable(&self, stamp: u32, deadline: Option<Instant>) -> bool {
        let h = self.hdr();
        self.wait_for(&h.data_seq.0, &h.readers_waiting, stamp, deadline)
    }

    /// Spins, then sleeps on `word` while it holds `seen`, until `deadline`. Returns false if
    /// the deadline passed. Runs a dead-process check when a sleep ends without progress.
    fn wait_for(
        &self,
        word: &AtomicU32,
        waiting: &AtomicU32,
        seen: u32,
        deadline: Option<Instant>,
    ) -> bool {
        let start = Instant::now();
        if deadline.is_some_and(|d| start >= d) {
            return false;
        }
        let backoff = Backoff::new();
        while word.load(Ordering::SeqCst) == seen {
            if start.elapsed() >= self.spin {
                let now = Instant::now();
                let left = match deadline {
                    Some(d) if d <= now => return false,
                    Some(d) => (d - now).min(RECOVER_TICK),
                    None => RECOVER_TICK,
                };
                waiting.fetch_add(1, Ordering::SeqCst);
                wait::wait(word, seen, Some(left));
                waiting.fetch_sub(1, Ordering::SeqCst);
                if word.load(Ordering::SeqCst) == seen {
                    self.recover();
                }
                return true;
            }
            backoff.snooze();
        }
        true
    }

    // ----- reading -----

    /// Claims up to `max` committed messages in FIFO order; blocks for the first one until
    /// `deadline` (`None`: forever). Each claim must be given back to [`Queue::release`].
    pub fn claim(&self, max: usize, deadline: Option<Instant>) -> Result<Vec<Claimed>> {
        let h = self.hdr();
        let mut out = Vec::new();
        loop {
            let seen = h.data_seq.0.load(Ordering::SeqCst);
            let mut sides = Vec::new();
            {
                let _g = self.lock();
                let head = h.head.load(Ordering::Relaxed);
                let mut read = h.read.load(Ordering::Relaxed);
                while read < head && out.len() < max.max(1) {
                    let rec = self.rec(read);
                    let size = rec.size.load(Ordering::Relaxed);
                    match rec.state.load(Ordering::Acquire) {
                        ST_PAD => {}
                        ST_ABANDONED => {
                            locked_sub(&h.pending, 1);
                        }
                        ST_READY => {
                            rec.owner.store(current_pid(), Ordering::Relaxed);
                            rec.state.store(ST_READING, Ordering::Relaxed);
                            locked_sub(&h.pending, 1);
                            out.push(self.describe(read, rec));
                            let flags = rec.flags.load(Ordering::Relaxed);
                            if flags & FLAG_SIDE != 0 {
                                let name = self.side_name(read, rec);
                                sides.push((out.len() - 1, SideRef::OneShot(name)));
                            } else if flags & FLAG_SLOT != 0 {
                                let (idx, gen) = slot_of(rec);
                                h.slots.hand_to(idx, gen, current_pid());
                                sides.push((out.len() - 1, SideRef::Slot(idx, gen)));
                            }
                        }
                        _ => break, // WRITING: FIFO order waits for it
                    }
                    read += size;
                }
                h.read.store(read, Ordering::Relaxed);
            }
            if !out.is_empty() {
                self.open_sides(&mut out, sides)?;
                return Ok(out);
            }
            if h.closed.load(Ordering::SeqCst) != 0 && h.pending.load(Ordering::Relaxed) == 0 {
                return Err(CoreError::Closed);
            }
            if !self.wait_for(&h.data_seq.0, &h.readers_waiting, seen, deadline) {
                return Err(CoreError::Empty);
            }
        }
    }

    /// Takes the next message if it is small and inline (at most [`SMALL_PARTS`] parts and
    /// `limit` bytes of body): hands its seq, kind and parts to `f`, then releases its record,
    /// all under *one* hold of the lock, where [`Queue::claim`] + [`Queue::release`] take it
    /// twice. This is the fast path for one small message per call. Never blocks.
    ///
    /// `f` runs with the queue lock held: it must be short, must not block, and must not
    /// touch this queue (the lock is not reentrant). A process killed inside `f` leaves the
    /// record `READING` with its pid, which [`Queue::recover`] turns into `ABANDONED`.
    pub fn take_small<R>(
        &self,
        limit: u64,
        f: impl FnOnce(u64, u32, &[&[u8]]) -> R,
    ) -> Result<Small<R>> {
        let h = self.hdr();
        let _g = self.lock();
        let head = h.head.load(Ordering::Relaxed);
        let mut read = h.read.load(Ordering::Relaxed);
        let found = loop {
            if read >= head {
                break None;
            }
            let rec = self.rec(read);
            match rec.state.load(Ordering::Acquire) {
                ST_PAD => {}
                ST_ABANDONED => {
                    locked_sub(&h.pending, 1);
                }
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
        if rec.flags.load(Ordering::Relaxed) != 0
            || nparts > SMALL_PARTS
            || body > limit
            || align_up(nparts as u64 * 8, ALIGN) > body
        {
            return Ok(Small::NotSmall);
        }
        let base = self.body_ptr(read) as *const u8;
        // SAFETY: the part table (nparts u64 lengths) starts the inline body; the writer
        // filled it before committing, and we hold the record.
        let lens = (0..nparts).map(|k| unsafe { (base as *const u64).add(k).read_unaligned() });
        let mut spans = [(0u64, 0u64); SMALL_PARTS];
        let mut k = 0;
        let total = body_layout(lens, |off, len| {
            spans[k] = (off, len);
            k += 1;
        });
        if total > body {
            return Ok(Small::NotSmall); // not a table the writer made; leave it to claim
        }
        // Ordered so that a death at any point leaves a state `recover` or `claim` handles:
        // READING (with our pid) first, then the positions, then DONE.
        rec.owner.store(current_pid(), Ordering::Relaxed);
        rec.state.store(ST_READING, Ordering::Relaxed);
        let mut parts: [&[u8]; SMALL_PARTS] = [&[]; SMALL_PARTS];
        for (p, &(off, len)) in parts.iter_mut().zip(&spans[..nparts]) {
            // SAFETY: the part lies inside the record's body (checked against `body_len`
            // just above), in the ring, and stays ours (READING) until we mark it DONE below.
            *p = unsafe { std::slice::from_raw_parts(base.add(off as usize), len as usize) };
        }
        let out = f(
            rec.seq.load(Ordering::Relaxed),
            rec.kind.load(Ordering::Relaxed),
            &parts[..nparts],
        );
        h.read
            .store(read + rec.size.load(Ordering::Relaxed), Ordering::Relaxed);
        locked_sub(&h.pending, 1);
        rec.state.store(ST_DONE, Ordering::Release);
        self.advance_tail(h);
        Ok(Small::Took(out))
    }

    fn describe(&self, pos: u64, rec: &RecordHeader) -> Claimed {
        let nparts = rec.nparts.load(Ordering::Relaxed) as usize;
        Claimed {
            pos,
            seq: rec.seq.load(Ordering::Relaxed),
            kind: rec.kind.load(Ordering::Relaxed),
            parts: Vec::with_capacity(nparts),
            side: None,
            released: false,
        }
    }

    fn side_name(&self, pos: u64, rec: &RecordHeader) -> String {
        let n = (rec.name_len.load(Ordering::Relaxed) as usize).min(ALIGN as usize * 2);
        let mut buf = vec![0u8; n];
        // SAFETY: the writer stored `name_len` bytes of name after the header under the lock.
        unsafe { std::ptr::copy_nonoverlapping(self.body_ptr(pos), buf.as_mut_ptr(), n) };
        String::from_utf8_lossy(&buf).into_owned()
    }

    /// Maps side segments and reads every claim's part table.
    fn open_sides(&self, out: &mut [Claimed], sides: Vec<(usize, SideRef)>) -> Result<()> {
        let mut err = None;
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
                SideRef::Slot(idx, gen) => {
                    let t = Taken {
                        idx,
                        gen,
                        size: 0,
                        fresh: false,
                    };
                    match self.maps.get(self.name(), t) {
                        Ok(seg) => {
                            let lease = Lease::new(self.seg.clone(), Self::table_at(), idx, gen);
                            out[i].side = Some(Arc::new(SideBuf::new(seg, Some(lease))));
                        }
                        Err(e) => {
                            let _g = self.lock();
                            self.hdr().slots.discard(self.name(), idx, gen);
                            err.get_or_insert(e);
                        }
                    }
                }
            }
        }
        for c in out.iter_mut() {
            let rec = self.rec(c.pos);
            let n = rec.nparts.load(Ordering::Relaxed) as usize;
            let base = match &c.side {
                Some(seg) => seg.as_ptr() as *const u8,
                None => self.body_ptr(c.pos) as *const u8,
            };
            // SAFETY: the part table (n u64 lengths) starts the body; the writer filled it
            // before committing, and we hold the claim.
            let lens = (0..n).map(|k| unsafe { (base as *const u64).add(k).read_unaligned() });
            let parts = &mut c.parts;
            body_layout(lens, |off, len| parts.push((off, len)));
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
        // SAFETY: offsets come from the body layout and lie inside the body.
        unsafe { base.add(off as usize) }
    }

    /// Gives claims back: their ring space is freed once every earlier record is released too.
    pub fn release(&self, claims: &mut [Claimed]) {
        let h = self.hdr();
        let _g = self.lock();
        for c in claims.iter_mut().filter(|c| !c.released) {
            self.rec(c.pos).state.store(ST_DONE, Ordering::Release);
            c.released = true;
        }
        self.advance_tail(h);
    }

    fn advance_tail(&self, h: &Header) {
        let read = h.read.load(Ordering::Relaxed);
        let mut tail = h.tail.load(Ordering::Relaxed);
        let start = tail;
        while tail < read {
            let rec = self.rec(tail);
            let st = rec.state.load(Ordering::Acquire);
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
            h.space_seq.0.fetch_add(1, Ordering::SeqCst);
            if h.writers_waiting.load(Ordering::SeqCst) > 0 {
                wait::wake_all(&h.space_seq.0);
            }
        }
    }

    /// Marks records left mid-write or mid-read by dead processes as abandoned, unlinks their
    /// side segments and frees their space. Returns how many were recovered. Waiters call this
    /// on their own whenever a sleep ends without progress.
    pub fn recover(&self) -> usize {
        let h = self.hdr();
        let mut found = 0;
        let mut dead_cache: Vec<(u32, bool)> = Vec::new();
        let mut alive = |pid: u32| -> bool {
            if let Some(&(_, a)) = dead_cache.iter().find(|(p, _)| *p == pid) {
                return a;
            }
            let a = pid_alive(pid);
            dead_cache.push((pid, a));
            a
        };
        let _g = self.lock();
        let head = h.head.load(Ordering::Relaxed);
        let mut pos = h.tail.load(Ordering::Relaxed);
        while pos < head {
            let rec = self.rec(pos);
            let st = rec.state.load(Ordering::Acquire);
            if (st == ST_WRITING || st == ST_READING) && !alive(rec.owner.load(Ordering::Relaxed)) {
                let flags = rec.flags.load(Ordering::Relaxed);
                if flags & FLAG_SIDE != 0 {
                    let _ = crate::shm::unlink_name(&self.side_name(pos, rec));
                } else if flags & FLAG_SLOT != 0 && st == ST_WRITING {
                    // Half written: the slot's content is garbage (a dead reader's slot is
                    // left to recover_dead below, by its holder pid).
                    let (idx, gen) = slot_of(rec);
                    h.slots.discard(self.name(), idx, gen);
                }
                rec.state.store(ST_ABANDONED, Ordering::Release);
                found += 1;
            }
            pos += rec.size.load(Ordering::Relaxed).max(ALIGN);
        }
        found += h.slots.recover_dead(self.name());
        if found > 0 {
            self.advance_tail(h);
            h.data_seq.0.fetch_add(1, Ordering::SeqCst);
            wait::wake_all(&h.data_seq.0);
        }
        found
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        // The creator removes pooled segments and those of messages nobody will read any
        // more: once the creating handle is dropped the queue is over (a forked child's copy
        // of it, and handles attached by name, leave them).
        if !self.seg.is_creator() {
            return;
        }
        // Views of pooled messages may keep the mapping alive (their leases hold it), but not
        // the name.
        let _ = self.seg.unlink();
        let h = self.hdr();
        h.slots.unlink_all(self.name());
        let head = h.head.load(Ordering::Relaxed);
        let mut pos = h.read.load(Ordering::Relaxed);
        while pos < head {
            let rec = self.rec(pos);
            if rec.flags.load(Ordering::Relaxed) & FLAG_SIDE != 0
                && rec.state.load(Ordering::Acquire) != ST_PAD
            {
                let _ = crate::shm::unlink_name(&self.side_name(pos, rec));
            }
            pos += rec.size.load(Ordering::Relaxed).max(ALIGN);
        }
    }
}

/// A side segment to map at claim.
enum SideRef {
    OneShot(String),
    Slot(usize, u64),
}

/// The slot (index, generation) of a slot record.
fn slot_of(rec: &RecordHeader) -> (usize, u64) {
    (
        (rec.slot.load(Ordering::Relaxed) as usize).min(crate::slots::SLOTS - 1),
        rec.slot_gen.load(Ordering::Relaxed),
    )
}

fn write_body(base: *mut u8, parts: &[&[u8]]) {
    let mut k = 0;
    body_layout(parts.iter().map(|p| p.len() as u64), |off, len| {
        let p = parts[k];
        // SAFETY: `base` points at a body reserved for exactly this layout: a table of
        // `parts.len()` u64 lengths, then each part at its offset; nobody else touches it
        // until the record is committed.
        unsafe {
            (base as *mut u64).add(k).write_unaligned(len);
            std::ptr::copy_nonoverlapping(p.as_ptr(), base.add(off as usize), p.len());
        }
        k += 1;
    });
}

#[cfg(test)]
mod tests {
    use super::*;
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
        q.hdr().slots.set_holder(idx, (i32::MAX - 7) as u32);
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
        q.close();
        full.close();
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
            thread::sleep(Duration::from_millis(1 + round % 5));
            q.close();
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
        q.close();
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
            let _g = q.lock();
            let r = q.try_reserve(h, 1, 0, 0, 0).unwrap();
            // Pretend a process that no longer exists holds it.
            q.rec(r.pos)
                .owner
                .store((i32::MAX - 3) as u32, Ordering::Relaxed);
        }
        q.put(2, 0, &[b"ok"], None).unwrap();
        // The reader would wait behind the dead record; recovery lets it through.
        let (seq, _, _) = get(&q, Some(Instant::now() + Duration::from_secs(5))).unwrap();
        assert_eq!(seq, 2);
    }

    /// Gets one small message the way Python's `get` does: [`Queue::take_small`], waiting on
    /// the data stamp when the queue is empty.
    fn take_one(q: &Queue, deadline: Option<Instant>) -> Result<(u64, u32, Vec<Vec<u8>>)> {
        let copy =
            |seq, kind, parts: &[&[u8]]| (seq, kind, parts.iter().map(|p| p.to_vec()).collect());
        loop {
            let stamp = q.data_stamp();
            match q.take_small(1 << 10, copy)? {
                Small::Took(m) => return Ok(m),
                Small::NotSmall => panic!("expected a small message"),
                Small::Empty => {
                    if !q.wait_readable(stamp, deadline) {
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
        assert!(matches!(q.take_small(64, |_, _, _| ()), Ok(Small::Empty)));
        // Zero parts, and an empty part.
        q.put(1, 0, &[], None).unwrap();
        q.put(2, 0, &[b""], None).unwrap();
        assert_eq!(take_one(&q, None).unwrap().2, Vec::<Vec<u8>>::new());
        assert_eq!(take_one(&q, None).unwrap().2, vec![Vec::<u8>::new()]);
        q.close();
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
                q.take_small(1 << 10, |_, _, _| ()),
                Ok(Small::NotSmall)
            ));
            assert_eq!(get(&q, None).unwrap().0, want);
        }
        assert_eq!(take_one(&q, None).unwrap(), (3, 0, vec![b"x".to_vec()]));
    }

    #[test]
    fn a_reader_killed_inside_take_small_does_not_block_the_queue() {
        let q = small(1 << 14);
        q.put(1, 0, &[b"lost with its reader"], None).unwrap();
        q.put(2, 0, &[b"next"], None).unwrap();
        // SAFETY: the child only touches the queue's shared memory and leaves with _exit, so
        // it runs no destructor or test-harness code inherited from this process.
        let child = unsafe { libc::fork() };
        assert!(child >= 0, "fork failed");
        if child == 0 {
            // Dies holding the queue lock, its record marked READING.
            let _ = q.take_small(1 << 10, |_, _, _| unsafe { libc::_exit(0) });
            unsafe { libc::_exit(1) };
        }
        let mut status = 0;
        // SAFETY: waits for our own child; `status` is a valid out-pointer.
        assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
        assert_eq!(
            q.hdr().lock.0.holder(),
            child as u32,
            "died holding the lock"
        );
        let first = q.rec(q.hdr().read.load(Ordering::Relaxed));
        assert_eq!(first.state.load(Ordering::Relaxed), ST_READING);
        // The lock is taken over and the dead reader's record is abandoned: the rest flows.
        let deadline = Some(Instant::now() + Duration::from_secs(10));
        let (seq, _, parts) = take_one(&q, deadline).unwrap();
        assert_eq!((seq, parts), (2, vec![b"next".to_vec()]));
        q.put(3, 0, &[b"after"], None).unwrap();
        assert_eq!(take_one(&q, deadline).unwrap().0, 3);
        assert_eq!(q.len(), 0);
    }

    #[test]
    fn lock_held_by_a_dead_process_is_taken_over() {
        let q = small(4096);
        q.hdr().lock.0.force_holder((i32::MAX - 5) as u32);
        q.put(1, 0, &[], None).unwrap();
        assert_eq!(get(&q, None).unwrap().0, 1);
    }

    #[test]
    fn attach_checks_the_layout() {
        let q = small(4096);
        let other = Queue::attach(q.name()).unwrap();
        other.put(5, 1, &[b"hi"], None).unwrap();
        assert_eq!(get(&q, None).unwrap().2[0], b"hi");
        let seg = Segment::create(8192, current_pid()).unwrap();
        assert!(matches!(
            Queue::attach(seg.name()),
            Err(CoreError::BadSegment(_))
        ));
    }
}
