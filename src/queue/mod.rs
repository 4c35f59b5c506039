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
//! no lock held, then *releases* them (one store each, no lock); `tail` advances over released
//! records, which frees ring space, whenever someone holds the lock. A small message read one
//! per call is instead *taken* ([`Queue::take_small`]): copied and released under a single hold
//! of the lock. Messages whose record would exceed `max_inline` bytes go to a *side segment* and
//! the ring holds only a reference to it; the reader maps it and hands out zero-copy views, so a
//! message larger than the ring never stalls the queue. Side segments come from a pool of
//! reusable *slots* ([`crate::slots`]), or, when the pool has none to give, are made for the
//! one message (*one-shot*) and unlinked by the reader.
//!
//! A writer may also *lease* a slot, fill it in place and send it by reference (`byref`): the
//! record's reference table names the slot, and no byte of it is copied.
//!
//! Files: [`layout`] (the shared layout), [`parties`] (who uses the queue), `write` (reserve,
//! fill, commit), `read` (claim, take, release), `byref` (leased slots sent by reference),
//! `recover` (the crash model and repair).
//!
//! # Crash model
//! Any process may die (or stop) between any two instructions. The lock
//! ([`crate::shmlock::ShmLock`]) holds a party *token* (party number and the generation of its
//! registration, [`parties`]); a waiter takes it over from a holder whose registration is dead (a
//! compare-and-swap on the very token it saw dead, so a number registered again since is never
//! taken for its old owner) and then *repairs* the queue (`recover.rs` lists what each death leaves
//! and how it is mended). A process judged dead that is in fact alive cannot undo a repair: its
//! commits and releases are compare-and-swaps on state words stamped with the record's position, so
//! its `put` fails with [`CoreError::JudgedDead`] (nothing acknowledged is lost) instead of landing
//! behind `read`, and its stale token makes it register afresh. Every wait, the lock's included,
//! has a deadline, and callers that hold the Python GIL only ever *try* the lock: the slow path
//! waits with the GIL released. The death of the queue's creator ends the queue: a waiter that
//! finds it dead closes the queue, so a wait with no deadline ends too.
//!
//! # Waiting
//! Blocked readers wait on the futex word `data_seq`, bumped by every commit and by close;
//! blocked writers on `space_seq`, bumped by every release and by close. Each side first spins
//! for at least its handle's spin and up to twice the length its waits lately took, at most
//! 200 µs (never past its deadline, never yielding the CPU, and only while its spins catch
//! what they wait for: [`crate::spin`]), and the other side makes a wake
//! system call only when someone is asleep (one waiter per committed message; every writer
//! when space is freed). A commit wakes first the reader that fell asleep last
//! (`last_reader`, a futex tag per party): in a request/response loop over several idle
//! readers the one that just handled a message, its caches warm, takes the next, where the
//! futex alone would wake them in the order they slept, each one cold.

mod byref;
#[cfg(test)]
mod byref_tests;
pub mod layout;
pub mod parties;
mod read;
mod recover;
mod spinners;
#[cfg(test)]
mod spinners_tests;
#[cfg(test)]
mod tests;
mod write;

use crate::error::{CoreError, Result};
use crate::liveness::{self, Identity, QueueToken};
use crate::shm::{Owner, Pages, Segment};
use crate::shmlock::ShmLockGuard;
use crate::slots::{SideBuf, SlotMaps, TableAt};
use crate::spin::{a_cpu_is_free, a_probe_may_spin, spin_until, SpinPolicy, Spun};
use crate::wait::{self, current_pid};
use layout::{align_up, Header, RecordHeader, ALIGN, HEADER_BYTES, MAGIC, REC_BYTES, VERSION};
use parties::Side;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use byref::WriterSlot;
pub use layout::{body_len, RefEntry, MAX_REFS};
pub use read::{Claimed, Small, SMALL_PARTS};
pub use write::PUT_BATCH;

/// A waiter that sleeps this long without progress checks for dead processes.
const RECOVER_TICK: Duration = Duration::from_millis(50);
/// Longest wait for the lock in error paths (cleaning up after a failed write or read): a
/// holder that is stopped costs the cleanup, never a hang.
const ERROR_WAIT: Duration = Duration::from_secs(1);
/// Default [`QueueConfig::pool_min`]: copying this much costs more than leasing a slot.
const DEFAULT_POOL_MIN: u64 = 256 << 10;
/// Largest ring a queue may have (1 TiB): larger sizes are refused, never wrapped.
pub const MAX_RING: u64 = 1 << 40;
/// Most messages a queue may hold at once.
pub const MAX_MESSAGES: u64 = 1 << 32;

/// Sizes of a queue, chosen by its creator.
#[derive(Clone, Debug)]
pub struct QueueConfig {
    /// Bytes in the ring (rounded up to a multiple of 64, at least 4 KiB, at most [`MAX_RING`]).
    pub ring_bytes: u64,
    /// Most messages in the queue at once (1 to [`MAX_MESSAGES`]).
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

/// How a wait for a queue's word ended ([`Queue::wait_readable`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waited {
    /// Its deadline passed.
    TimedOut,
    /// The word changed, or may have (a sleep ended): look again.
    Woke,
    /// A spin saw the word change after this long, without a sleep.
    Caught(Duration),
}

/// Adds the time since `start` to `total` when dropped: a wait's length, however it ends.
struct WaitTimer<'a> {
    start: Instant,
    total: &'a AtomicU64,
}

impl Drop for WaitTimer<'_> {
    fn drop(&mut self) {
        let ns = u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.total.fetch_add(ns, Ordering::Relaxed);
    }
}

/// A handle on a queue; every process holds its own (created, or attached by name).
pub struct Queue {
    seg: Arc<Segment>,
    ring_size: u64,
    /// How long a blocked call may spin before it sleeps at least (0: never; longer when its
    /// waits take longer: [`SpinPolicy::budget`]).
    spin: Duration,
    /// Whether this handle's waits spin first, readers' and writers' ([`crate::spin`]).
    spin_policy: [SpinPolicy; 2],
    /// The longest spin this handle's reads claim, and the furthest ahead a claim its
    /// commits trust ([`spinners::CLAIM_MAX`]; longer in tests, whose verdicts must not
    /// depend on how long a thread is descheduled).
    claim_max: Duration,
    /// Nanoseconds this handle's calls spent in [`Queue::wait_for`] (spinning or asleep):
    /// waits for a message or for room only, never the copies a put or get makes (a
    /// producer's stats tell its waits from its own work by it). Only added to.
    waited_ns: AtomicU64,
    /// This process's mappings of slot segments.
    maps: SlotMaps,
    /// `pid << 32 | token`: this process's party in the queue, registered on first use, in
    /// a forked child (whose pid differs), and again once its registration went stale.
    me: AtomicU64,
    /// Slots (index, generation) a failed write must discard and could not yet, not having
    /// had the lock (its caller holds the GIL and only tries it): discarded by this handle's
    /// next hold of the lock. `has_deferred` says whether the list may be non-empty.
    deferred: std::sync::Mutex<Vec<(usize, u64)>>,
    has_deferred: std::sync::atomic::AtomicBool,
    /// This handle's shared hold on the queue's token, taken before the segment was opened:
    /// the queue's names stay while any handle (or a forked child's copy) holds one. `None`
    /// only for a queue name without a queue tag, or once dropped.
    token: Option<QueueToken>,
    /// Scans for the dead started by this handle's waiters (tests).
    #[cfg(test)]
    scans: AtomicU64,
    /// Commits of this handle that woke sleeping readers (tests).
    #[cfg(test)]
    reader_wakes: AtomicU64,
}

impl Queue {
    /// Creates a queue in a new shared-memory segment owned by this process.
    pub fn create(cfg: &QueueConfig) -> Result<Queue> {
        if cfg.ring_bytes > MAX_RING {
            return Err(CoreError::Invalid(format!(
                "capacity_bytes must be at most {MAX_RING} (1 TiB), got {}",
                cfg.ring_bytes
            )));
        }
        if cfg.max_messages == 0 || cfg.max_messages > MAX_MESSAGES {
            return Err(CoreError::Invalid(format!(
                "max_messages must be between 1 and {MAX_MESSAGES}, got {}",
                cfg.max_messages
            )));
        }
        let ring = align_up(cfg.ring_bytes.max(4096), ALIGN);
        let max_inline = cfg
            .max_inline
            .unwrap_or(ring / 4)
            .clamp(REC_BYTES * 2, ring / 2);
        let owner = liveness::me()?;
        crate::late_leaves::retry();
        let token = QueueToken::create(owner)?;
        // The ring is used a little at a time: its pages are mapped as they are first
        // touched, so that making a queue costs nothing per byte of ring (committing its
        // space still does: posix_fallocate).
        let made = Segment::create_tagged_with(
            HEADER_BYTES + ring as usize,
            &token.tag().tag(),
            Pages::OnTouch,
        )
        .and_then(|seg| {
            let key = crate::trust::random_u64().map_err(|e| CoreError::Io {
                context: "getrandom for a queue's slot names".into(),
                source: e,
            })?;
            Ok((seg, key))
        });
        let (seg, name_key) = match made {
            Ok(made) => made,
            Err(e) => {
                drop(token.leave()); // the last (only) party: the token goes too
                return Err(e);
            }
        };
        let q = Queue::over(seg, ring, Some(token));
        let h = q.hdr();
        h.version.store(VERSION, Ordering::Relaxed);
        h.owner.store(owner.packed(), Ordering::Relaxed);
        h.ring_size.store(ring, Ordering::Relaxed);
        h.max_msgs.store(cfg.max_messages, Ordering::Relaxed);
        h.max_inline.store(max_inline, Ordering::Relaxed);
        let side_budget = cfg.side_budget.unwrap_or(ring).max(1);
        h.side_budget.store(side_budget, Ordering::Relaxed);
        h.slots.init(
            cfg.pool_bytes.unwrap_or(side_budget.saturating_mul(2)),
            name_key,
        );
        h.pool_min.store(
            cfg.pool_min.unwrap_or(DEFAULT_POOL_MIN.min(max_inline)),
            Ordering::Relaxed,
        );
        h.magic.store(MAGIC, Ordering::Release);
        Ok(q)
    }

    fn over(seg: Segment, ring: u64, token: Option<QueueToken>) -> Queue {
        Queue {
            seg: Arc::new(seg),
            ring_size: ring,
            spin: Duration::from_micros(20),
            spin_policy: Default::default(),
            claim_max: spinners::CLAIM_MAX,
            waited_ns: AtomicU64::new(0),
            maps: SlotMaps::default(),
            me: AtomicU64::new(0),
            deferred: std::sync::Mutex::new(Vec::new()),
            has_deferred: std::sync::atomic::AtomicBool::new(false),
            token,
            #[cfg(test)]
            scans: AtomicU64::new(0),
            #[cfg(test)]
            reader_wakes: AtomicU64::new(0),
        }
    }

    /// Attaches to a queue created by another process (or this one) by its segment name.
    /// Every size in the header is checked, so a corrupt or foreign segment is an error, not
    /// a crash.
    pub fn attach(name: &str) -> Result<Queue> {
        crate::late_leaves::retry();
        // Hold the queue's token first: from then on no sweep removes its names.
        let token = match crate::shm::owner_of(name) {
            Some(Owner::Queue(tag)) => Some(QueueToken::join(tag)?),
            _ => None,
        };
        let seg = match Segment::attach_with(name, Pages::OnTouch) {
            Ok(seg) => seg,
            Err(e) => {
                // Gone (or refused): if we were the last to hold the token, it goes too.
                drop(token.and_then(QueueToken::leave));
                return Err(e);
            }
        };
        let bad = |what: &str| Err(CoreError::BadSegment(format!("{name}: {what}")));
        if seg.len() < HEADER_BYTES + 4096 {
            return bad("too small for a queue");
        }
        // SAFETY: the segment is at least HEADER_BYTES long and page aligned; every field of
        // the header is an atomic, valid for any bit pattern.
        let h = unsafe { &*(seg.as_ptr() as *const Header) };
        if h.magic.load(Ordering::Acquire) != MAGIC || h.version.load(Ordering::Relaxed) != VERSION
        {
            return bad(&format!(
                "not an easycore queue of layout version {VERSION}"
            ));
        }
        let ring = h.ring_size.load(Ordering::Relaxed);
        let max_inline = h.max_inline.load(Ordering::Relaxed);
        if ring < 4096 || ring % ALIGN != 0 || ring > MAX_RING {
            return bad(&format!("invalid ring size {ring}"));
        }
        if (HEADER_BYTES as u64).saturating_add(ring) > seg.len() as u64 {
            return bad("ring larger than the segment");
        }
        if max_inline < REC_BYTES * 2 || max_inline > ring / 2 {
            return bad(&format!("invalid inline limit {max_inline}"));
        }
        if h.max_msgs.load(Ordering::Relaxed) == 0 {
            return bad("max_messages is 0");
        }
        Ok(Queue::over(seg, ring, token))
    }

    /// Sets how long a blocked call spins before it sleeps at least (this handle only; 0:
    /// never). Its waits' learned length may lengthen a spin up to [`crate::spin::SPIN_CAP`];
    /// a call never spins past its own deadline.
    pub fn set_spin(&mut self, spin: Duration) {
        self.spin = spin;
    }

    pub(crate) fn hdr(&self) -> &Header {
        // SAFETY: the segment starts with a Header (checked at attach, written at create); it is
        // page aligned and lives as long as `self`. All fields are atomics.
        unsafe { &*(self.seg.as_ptr() as *const Header) }
    }

    fn ring_ptr(&self) -> *mut u8 {
        // SAFETY: HEADER_BYTES < segment length (checked at create/attach).
        unsafe { self.seg.as_ptr().add(HEADER_BYTES) }
    }

    pub(crate) fn rec(&self, pos: u64) -> &RecordHeader {
        let off = pos % self.ring_size;
        let off = off - off % ALIGN; // positions are 64-aligned; never trust shared memory
                                     // SAFETY: `off` is a 64-aligned offset inside the ring and a whole header fits before
                                     // the ring's end (ring size is a multiple of 64); fields are atomics.
        unsafe { &*(self.ring_ptr().add(off as usize) as *const RecordHeader) }
    }

    fn body_ptr(&self, pos: u64) -> *mut u8 {
        // SAFETY: a record's body follows its header inside the ring (reserve never splits a
        // record across the ring's end; readers check sizes against the ring before use).
        unsafe {
            self.ring_ptr()
                .add((pos % self.ring_size + REC_BYTES) as usize)
        }
    }

    /// The segment's name: pass it to [`Queue::attach`] in another process.
    pub fn name(&self) -> &str {
        self.seg.name()
    }

    /// The creator's identity: its death (kernel-vouched) ends the queue.
    pub fn owner(&self) -> Option<Identity> {
        Identity::unpack(self.hdr().owner.load(Ordering::Relaxed))
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
    /// the queue is drained. Pooled segments no message holds are unlinked now (if the lock can
    /// be had within `deadline`), the others as they are freed.
    pub fn close(&self, deadline: Option<Instant>) {
        let h = self.hdr();
        h.closed.store(1, Ordering::SeqCst);
        h.data_seq.0.fetch_add(1, Ordering::SeqCst);
        h.space_seq.0.fetch_add(1, Ordering::SeqCst);
        wait::wake_all(&h.data_seq.0);
        wait::wake_all(&h.space_seq.0);
        if let Ok(_g) = self.lock_until(deadline) {
            h.slots.evict_free(self.name());
        }
    }

    /// Closes the queue if its creator died. The creator's death ends the queue (the next
    /// sweep removes its names), so nobody may wait on it for ever: waiters ask this each
    /// time a sleep ends without progress, and then wake as for [`Queue::close`] (gets drain
    /// what is left first). One `flock` probe of the creator's liveness token.
    pub fn close_if_owner_died(&self) {
        if self.is_closed() {
            return;
        }
        if self.owner().is_some_and(|o| !liveness::alive(o)) {
            self.close(Some(Instant::now() + RECOVER_TICK));
        }
    }

    /// Whether [`Queue::close`] was called by anyone.
    pub fn is_closed(&self) -> bool {
        self.hdr().closed.load(Ordering::SeqCst) != 0
    }

    /// This process's party token (`parties`), registering it on first use, after a fork,
    /// and again if its registration was freed (repair judged it dead: its old token is
    /// stale, and nothing it held is its own any more).
    pub(crate) fn party(&self) -> Result<u32> {
        let pid = current_pid();
        let m = self.me.load(Ordering::Relaxed);
        let h = self.hdr();
        if (m >> 32) as u32 == pid && m as u32 != 0 && h.parties.current(m as u32) {
            return Ok(m as u32);
        }
        let id = liveness::me()?;
        let reg = h.parties.register(id).ok_or_else(|| {
            CoreError::Invalid(format!(
                "more than {} live processes use queue {}",
                parties::PARTIES,
                self.name()
            ))
        })?;
        let t = reg.token;
        if let Some((was, waits)) = reg.adopted {
            // A dead party's entry: its tokens are stale now (the generation moved on), so
            // whatever names them (the lock word included) is judged dead. Repair before
            // anything else; if the lock cannot be had now, give the entry back (still dead)
            // and let the caller retry.
            parties::forget_sleepers(&h.readers_waiting, &h.writers_waiting, waits);
            let deadline = Some(Instant::now() + RECOVER_TICK);
            let Some(g) = h.lock.0.lock(t, deadline, |q| h.parties.token_alive(q)) else {
                h.parties.give_back(t, id.packed(), was);
                return Err(self.busy());
            };
            self.repair(h);
            drop(g);
        }
        self.me
            .store((u64::from(pid) << 32) | u64::from(t), Ordering::Relaxed);
        Ok(t)
    }

    /// Takes the lock, waiting until `deadline` at most (`Err(Busy)` then); repairs the queue
    /// first when the lock was taken over from a dead holder.
    pub(crate) fn lock_until(&self, deadline: Option<Instant>) -> Result<ShmLockGuard<'_>> {
        let me = self.party()?;
        let h = self.hdr();
        let g = h
            .lock
            .0
            .lock(me, deadline, |t| h.parties.token_alive(t))
            .ok_or_else(|| self.busy())?;
        if g.took_over() {
            self.repair(h);
        }
        self.run_deferred();
        Ok(g)
    }

    /// Discards slots a failed write leaves: under the lock, waited for at most
    /// [`ERROR_WAIT`] if `wait`, else only tried (the caller holds the GIL), and deferred to
    /// this handle's next hold of the lock if it could not be had.
    pub(crate) fn discard_slots(&self, slots: Vec<(usize, u64)>, wait: bool) {
        if slots.is_empty() {
            return;
        }
        let g = if wait {
            self.lock_until(Some(Instant::now() + ERROR_WAIT)).ok()
        } else {
            self.try_lock().ok()
        };
        match g {
            Some(_g) => {
                for (idx, gen) in slots {
                    self.hdr().slots.discard(self.name(), idx, gen);
                }
            }
            None => {
                self.deferred
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .extend(slots);
                self.has_deferred.store(true, Ordering::Release);
            }
        }
    }

    /// Under the lock: the discards deferred by [`Queue::discard_slots`].
    fn run_deferred(&self) {
        if !self.has_deferred.load(Ordering::Acquire) {
            return;
        }
        // The flag first: a slot deferred meanwhile is either taken below or sets it again.
        self.has_deferred.store(false, Ordering::Release);
        let slots = std::mem::take(&mut *self.deferred.lock().unwrap_or_else(|p| p.into_inner()));
        for (idx, gen) in slots {
            self.hdr().slots.discard(self.name(), idx, gen);
        }
    }

    /// Takes the lock only if it is free within a short spin (for callers holding the GIL).
    pub(crate) fn try_lock(&self) -> Result<ShmLockGuard<'_>> {
        let me = self.party()?;
        let g = self.hdr().lock.0.try_lock(me).ok_or_else(|| self.busy())?;
        self.run_deferred();
        Ok(g)
    }

    fn busy(&self) -> CoreError {
        let h = self.hdr();
        CoreError::Busy {
            holder_pid: h.parties.identity(h.lock.0.holder()).map(|id| id.pid),
        }
    }

    /// Where a [`crate::slots::Lease`] finds the lock, the closed flag and the slot table.
    pub(crate) fn table_at() -> TableAt {
        TableAt {
            lock: std::mem::offset_of!(Header, lock),
            closed: std::mem::offset_of!(Header, closed),
            table: std::mem::offset_of!(Header, slots),
        }
    }

    /// Bodies of at least this many bytes travel in pooled slots when one can be had.
    pub fn pool_min(&self) -> u64 {
        self.hdr().pool_min.load(Ordering::Relaxed)
    }

    /// Bytes of large messages (outside the ring) the queue holds at once: set at creation.
    pub fn side_budget(&self) -> u64 {
        self.hdr().side_budget.load(Ordering::Relaxed)
    }

    /// Bytes of pooled side segments that exist now, and the most the pool may keep.
    pub fn pool_bytes(&self) -> (u64, u64) {
        self.hdr().slots.bytes()
    }

    /// Raises the pool's cap to `cap` bytes if it is lower (it never shrinks): a runner's
    /// producers make room for the results they see. Returns the cap now.
    pub fn grow_pool(&self, cap: u64) -> u64 {
        self.hdr().slots.grow_cap(cap)
    }

    /// How long this handle's calls waited for a message or for room so far (spinning or
    /// asleep): not the time their copies took.
    pub fn waited(&self) -> Duration {
        Duration::from_nanos(self.waited_ns.load(Ordering::Relaxed))
    }

    /// A stamp of the readers' wake-up word: read it *before* looking for a message, then
    /// pass it to [`Queue::wait_readable`] if none was there.
    pub fn data_stamp(&self) -> u32 {
        self.hdr().data_seq.0.load(Ordering::SeqCst)
    }

    /// Waits until a message is committed (or the queue closed) after `stamp` was taken, or
    /// until `deadline` ([`Waited::TimedOut`]). Spins first, then sleeps. The reader then looks
    /// for its message and says whether it got one ([`Queue::settle_read_spin`]): a spin that
    /// caught a commit another reader took caught nothing.
    pub fn wait_readable(&self, stamp: u32, deadline: Option<Instant>) -> Waited {
        let h = self.hdr();
        self.wait_for(
            &h.data_seq.0,
            &h.readers_waiting,
            Side::Reader,
            stamp,
            deadline,
        )
    }

    /// What a reader's wait `waited` was worth: `got` whether the look that followed found a
    /// message. A spin counts as caught (and its length is learned) only if it did
    /// ([`crate::spin`]): an idle reader that sees every commit another reader takes would
    /// otherwise go on spinning for them.
    pub fn settle_read_spin(&self, waited: Waited, got: bool) {
        self.settle_spin(Side::Reader, waited, got);
    }

    /// A writer waits until space is freed after `seen` (the writers' word), or until
    /// `deadline`; false if the deadline passed. (Freed space is there for every writer: a
    /// spin that saw it caught it.)
    pub(crate) fn wait_for_space(&self, seen: u32, deadline: Option<Instant>) -> bool {
        let h = self.hdr();
        let waited = self.wait_for(
            &h.space_seq.0,
            &h.writers_waiting,
            Side::Writer,
            seen,
            deadline,
        );
        self.settle_spin(Side::Writer, waited, true);
        waited != Waited::TimedOut
    }

    fn settle_spin(&self, side: Side, waited: Waited, got: bool) {
        if let Waited::Caught(took) = waited {
            let policy = &self.spin_policy[side as usize];
            policy.record(got);
            if got {
                policy.learn(took);
            }
        }
    }

    /// Spins (if this side's spins pay: [`crate::spin`]), then sleeps on `word` while it
    /// holds `seen`, until `deadline`. [`Waited::TimedOut`] if the deadline passed. Runs a
    /// dead-process check when a sleep ends without progress. A spin that caught the change
    /// is not recorded here: the caller settles it ([`Queue::settle_spin`]) once it knows
    /// whether the change was worth anything to it.
    fn wait_for(
        &self,
        word: &AtomicU32,
        waiting: &AtomicU32,
        side: Side,
        seen: u32,
        deadline: Option<Instant>,
    ) -> Waited {
        let start = Instant::now();
        // Adds this wait's length to `waited_ns` on every way out.
        let _timed = WaitTimer {
            start,
            total: &self.waited_ns,
        };
        let past = |now: Instant| deadline.is_some_and(|d| now >= d);
        if past(start) {
            return Waited::TimedOut;
        }
        if word.load(Ordering::SeqCst) != seen {
            return Waited::Woke;
        }
        let policy = &self.spin_policy[side as usize];
        let spun = !self.spin.is_zero() && policy.spins(a_probe_may_spin);
        if spun {
            // Longer than the handle's own spin only while a CPU is free (crate::spin).
            let mut budget = policy.budget(self.spin);
            if budget > self.spin && !a_cpu_is_free() {
                budget = self.spin;
            }
            let until = match deadline {
                Some(d) => d.min(start + budget),
                None => start + budget,
            };
            // A reader's spin claims the next commit: it wakes no sleeper (queue::spinners).
            let claim = matches!(side, Side::Reader).then(|| self.claim_spin(until - start));
            let outcome = spin_until(until, || word.load(Ordering::SeqCst) != seen);
            if let Some(claim) = claim {
                self.withdraw_spin_claim(claim); // before the last look at the word
            }
            if outcome == Spun::Caught {
                return Waited::Caught(start.elapsed());
            }
            policy.record(false);
            if word.load(Ordering::SeqCst) != seen {
                return Waited::Woke; // it came while this thread was descheduled
            }
        }
        let now = Instant::now();
        if past(now) {
            return Waited::TimedOut;
        }
        let left = match deadline {
            Some(d) => (d - now).min(RECOVER_TICK),
            None => RECOVER_TICK,
        };
        let Ok(me) = self.party() else {
            return Waited::Woke; // cannot sleep counted: let the caller retry
        };
        let h = self.hdr();
        // The party's own count goes up first and down last, so it always covers what this
        // waiter added to the total, which repair takes off (saturating) if it frees the
        // party.
        h.parties.note_wait(me, side, true);
        waiting.fetch_add(1, Ordering::SeqCst);
        if matches!(side, Side::Reader) {
            let p = parties::split(me).0;
            h.last_reader.store(p, Ordering::SeqCst);
            wait::wait_tagged(word, seen, Some(left), reader_tag(p));
            let _ = h
                .last_reader
                .compare_exchange(p, 0, Ordering::SeqCst, Ordering::Relaxed);
        } else {
            wait::wait(word, seen, Some(left));
        }
        let _ = waiting.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
            Some(v.saturating_sub(1))
        });
        h.parties.note_wait(me, side, false);
        if word.load(Ordering::SeqCst) == seen {
            self.close_if_owner_died();
            self.recover_if_due();
        } else if !spun && !self.spin.is_zero() {
            // The whole wait, the wake-up included: what a spin would have had to outlast.
            policy.learn(start.elapsed());
        }
        Waited::Woke
    }

    /// [`Queue::recover`], unless some waiter of this queue (in any process) started a scan
    /// less than a recovery tick ago.
    fn recover_if_due(&self) {
        let h = self.hdr();
        let now = wait::monotonic_ns();
        let last = h.last_scan.load(Ordering::Relaxed);
        let tick = RECOVER_TICK.as_nanos() as u64;
        if now.wrapping_sub(last) < tick && last <= now {
            return;
        }
        if h.last_scan
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            #[cfg(test)]
            self.scans.fetch_add(1, Ordering::Relaxed);
            self.recover();
        }
    }

    /// Wakes sleeping readers after `n` commits (one each, but none for the commit a
    /// spinning reader claimed): the one that fell asleep last first (`last_reader`), any
    /// others after it.
    fn wake_readers(&self, n: u32) {
        let h = self.hdr();
        h.data_seq.0.fetch_add(1, Ordering::SeqCst);
        // One commit is for the reader spinning now, if one claimed it (queue::spinners).
        let n = n.max(1) - u32::from(self.take_spin_claim());
        if n > 0 && h.readers_waiting.load(Ordering::SeqCst) > 0 {
            #[cfg(test)]
            self.reader_wakes.fetch_add(1, Ordering::Relaxed);
            let last = h.last_reader.load(Ordering::SeqCst);
            let woken = if last == 0 {
                0
            } else {
                wait::wake_tagged(&h.data_seq.0, 1, reader_tag(last))
            };
            if woken < n {
                wait::wake(&h.data_seq.0, n - woken);
            }
        }
    }

    /// Wakes every sleeping writer: freed space may fit several.
    fn wake_writers(&self) {
        let h = self.hdr();
        h.space_seq.0.fetch_add(1, Ordering::SeqCst);
        if h.writers_waiting.load(Ordering::SeqCst) > 0 {
            wait::wake_all(&h.space_seq.0);
        }
    }

    /// The side buffer of a pooled slot, mapped in this process, with the lease that frees it.
    fn lease(&self, idx: usize, gen: u64, seg: Arc<Segment>, party: u32) -> Arc<SideBuf> {
        let lease = crate::slots::Lease::new(self.seg.clone(), Self::table_at(), idx, gen, party);
        Arc::new(SideBuf::new(seg, Some(lease)))
    }
}

/// The futex tag a reader of party `p` sleeps with: one of 32 bits, so a wake aimed at it
/// may also pick a party 32 apart (still a sleeping reader: nothing is lost).
fn reader_tag(p: u32) -> u32 {
    1 << (p.wrapping_sub(1) % 32)
}

impl Drop for Queue {
    fn drop(&mut self) {
        // The creator removes pooled segments and those of messages nobody will read any
        // more: once the creating handle is dropped the queue is over (a forked child's copy
        // of it, and handles attached by name, leave them, unless they are the last).
        // The last process to leave (whoever it is) removes what is left, holding the token
        // exclusively meanwhile; the hold removes the token itself when dropped, last.
        // A hold that a child being forked still copies makes a last party look like one
        // of many: such a leave is noted and retried (`late_leaves`).
        crate::late_leaves::retry();
        let token = self.token.take();
        let tag = token.as_ref().map(QueueToken::tag);
        let last = token.and_then(QueueToken::leave);
        if let (None, Some(tag)) = (&last, tag) {
            if crate::sweep::is_ours(&tag.token_path()) {
                crate::late_leaves::note(tag);
            }
        }
        if let (Some(_hold), Some(tag)) = (&last, tag) {
            // Every name of the queue, those no table names included (a party that died
            // between two steps of an eviction leaves one): nobody maps them again.
            let _ = self.seg.unlink();
            crate::sweep::unlink_queue_names(tag);
            return;
        }
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
        if head.wrapping_sub(pos) > self.ring_size {
            return; // corrupt positions: no walk over memory they do not describe
        }
        let mut n = 0;
        while pos < head && n <= h.max_msgs.load(Ordering::Relaxed) {
            let rec = self.rec(pos);
            if !self.sane(pos, rec, head) {
                break;
            }
            if rec.flags.load(Ordering::Relaxed) & layout::FLAG_SIDE != 0
                && rec.state() != layout::ST_PAD
            {
                let _ = crate::shm::unlink_name(&self.side_name(pos, rec));
            }
            pos += rec.size.load(Ordering::Relaxed);
            n += 1;
        }
    }
}
