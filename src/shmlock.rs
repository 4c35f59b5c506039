//! The short lock in shared memory that guards a queue's positions, counters and slot table;
//! it survives the death of its holder and never makes a waiter wait past its deadline.
//!
//! The lock word holds the holder's *party* number (its entry in the queue's party table, see
//! `queue::parties`, 1-based; 0 when free) and a `CONTENDED` bit, in the style of Drepper's
//! futex mutex ("Futexes are tricky", mutex 2): a waiter sets the bit before it sleeps, and an
//! unlock that finds the bit set wakes one waiter. A waiter killed while asleep leaves at most
//! the bit set, which costs one spare wake-up, once.
//!
//! Waiting: spin briefly, then sleep on the word in naps of at most [`NAP`], never past the
//! caller's deadline ([`ShmLock::lock`] returns `None` then). After a nap that ends with the
//! same holder, seen for a nap or more since it last asked, the waiter asks the holder's
//! liveness token (kernel-vouched, see [`crate::liveness`]) and takes the lock over from a
//! dead holder with one compare-and-swap.
//! The new holder is told ([`ShmLockGuard::took_over`]) and must repair what the dead holder
//! left half-done before it relies on the guarded state (the robust-mutex "owner died"
//! pattern). A *stopped* holder is alive: waiters time out, repeatedly if they retry, but are
//! never stuck and never steal a lock from a process that may resume.
//!
//! Threads of one process share a party, so the lock is not reentrant and guards only short,
//! non-blocking sections.

use crate::wait;
use crossbeam_utils::Backoff;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Set in the lock word while someone may be asleep on it.
const CONTENDED: u32 = 1 << 31;
/// Longest sleep between two looks at the holder's liveness.
const NAP: Duration = Duration::from_millis(10);

/// The lock: one word, `#[repr(C)]` so that it can live in a shared-memory layout.
#[repr(C)]
pub struct ShmLock {
    /// Invariant: 0 when free; otherwise the holder's party (1..=`i32::MAX`), possibly with
    /// [`CONTENDED`] set. Only the holder clears it (unlock), or a waiter that saw the holder
    /// dead replaces it (takeover), both by one atomic operation.
    word: AtomicU32,
    _reserved: u32,
}

/// Holds a [`ShmLock`] until dropped.
pub struct ShmLockGuard<'a> {
    lock: &'a ShmLock,
    took_over: bool,
}

impl ShmLockGuard<'_> {
    /// Whether the lock was taken over from a holder that died: the guarded state may be
    /// half-updated and must be repaired first.
    pub fn took_over(&self) -> bool {
        self.took_over
    }
}

impl Drop for ShmLockGuard<'_> {
    fn drop(&mut self) {
        if self.lock.word.swap(0, Ordering::Release) & CONTENDED != 0 {
            wait::wake_one(&self.lock.word);
        }
    }
}

impl ShmLock {
    /// Takes the lock if it is free now or becomes free within a short spin; never sleeps,
    /// never takes over. For callers that hold the GIL: on `None` they retry the slow way.
    pub fn try_lock(&self, me: u32) -> Option<ShmLockGuard<'_>> {
        let backoff = Backoff::new();
        loop {
            if self
                .word
                .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return Some(ShmLockGuard {
                    lock: self,
                    took_over: false,
                });
            }
            if backoff.is_completed() {
                return None;
            }
            backoff.snooze();
        }
    }

    /// Takes the lock as party `me`, waiting until `deadline` at most (`None`: no deadline,
    /// but still in bounded naps, taking over from dead holders). `alive(holder)` tells
    /// whether the party in the lock word is alive.
    pub fn lock(
        &self,
        me: u32,
        deadline: Option<Instant>,
        alive: impl Fn(u32) -> bool,
    ) -> Option<ShmLockGuard<'_>> {
        if let Some(g) = self.try_lock(me) {
            return Some(g);
        }
        // The holder being watched and since when: its token is asked at most once a nap.
        // A busy holder often takes the lock again before a woken waiter runs; asking at
        // every such wake-up cost a file open, a flock and a close each time (thousands a
        // second on a queue that a caller and its producers share).
        let mut watch: Option<(u32, Instant)> = None;
        loop {
            let cur = self.word.load(Ordering::Relaxed);
            if cur == 0 {
                // Others may sleep behind us: keep the bit so our unlock wakes them.
                if self
                    .word
                    .compare_exchange(0, me | CONTENDED, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    return Some(ShmLockGuard {
                        lock: self,
                        took_over: false,
                    });
                }
                continue;
            }
            if cur & CONTENDED == 0
                && self
                    .word
                    .compare_exchange(cur, cur | CONTENDED, Ordering::Relaxed, Ordering::Relaxed)
                    .is_err()
            {
                continue;
            }
            let nap = match deadline {
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return None;
                    }
                    (d - now).min(NAP)
                }
                None => NAP,
            };
            let holder = cur & !CONTENDED;
            let since = match watch {
                Some((h, since)) if h == holder => since,
                _ => {
                    let t = Instant::now();
                    watch = Some((holder, t));
                    t
                }
            };
            wait::wait(&self.word, cur | CONTENDED, Some(nap));
            let now = self.word.load(Ordering::Relaxed);
            if now & !CONTENDED != holder {
                continue;
            }
            let t = Instant::now();
            if t - since < NAP {
                continue; // asked (or first seen) less than a nap ago
            }
            watch = Some((holder, t));
            if !alive(holder)
                && self
                    .word
                    .compare_exchange(now, me | CONTENDED, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return Some(ShmLockGuard {
                    lock: self,
                    took_over: true,
                });
            }
        }
    }

    /// The holder's party, 0 when free.
    pub fn holder(&self) -> u32 {
        self.word.load(Ordering::Relaxed) & !CONTENDED
    }

    /// Marks the lock as held by `party` (tests: simulate a holder that died inside it).
    #[cfg(test)]
    pub fn force_holder(&self, party: u32) {
        self.word.store(party, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn new_lock() -> Arc<ShmLock> {
        Arc::new(ShmLock {
            word: AtomicU32::new(0),
            _reserved: 0,
        })
    }

    #[test]
    fn excludes_and_hands_over() {
        let l = new_lock();
        let counter = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let threads: Vec<_> = (1..=4u32)
            .map(|me| {
                let (l, c) = (l.clone(), counter.clone());
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        let g = l.lock(me, None, |_| true).unwrap();
                        assert!(!g.took_over());
                        // A non-atomic increment made atomic by the lock.
                        let v = c.load(Ordering::Relaxed);
                        c.store(v + 1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(counter.load(Ordering::Relaxed), 80_000);
        assert_eq!(l.holder(), 0);
    }

    #[test]
    fn a_live_holder_makes_waiters_time_out_not_hang() {
        let l = new_lock();
        l.force_holder(7);
        let d = Instant::now() + Duration::from_millis(30);
        assert!(l.lock(1, Some(d), |_| true).is_none());
        assert!(l.try_lock(1).is_none());
        assert_eq!(l.holder(), 7);
    }

    #[test]
    fn a_dead_holder_is_taken_over_and_the_taker_is_told() {
        let l = new_lock();
        l.force_holder(7);
        let g = l.lock(1, None, |p| p != 7).unwrap();
        assert!(g.took_over());
        assert_eq!(l.holder(), 1);
        drop(g);
        assert_eq!(l.holder(), 0);
        assert!(!l.lock(2, None, |_| true).unwrap().took_over());
    }

    #[test]
    fn a_holder_seen_at_every_wake_up_is_asked_at_most_once_a_nap() {
        // A busy holder that takes the lock again before each woken waiter runs looks, to
        // the waiter, like wake-ups with the same holder: simulated here by waking it while
        // party 7 holds the lock throughout. Its token must not be asked at each wake-up.
        let l = new_lock();
        l.force_holder(7 | CONTENDED);
        let asked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let waker = {
            let (l, stop) = (l.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    wait::wake_one(&l.word);
                    std::thread::sleep(Duration::from_micros(100));
                }
            })
        };
        let wait_for = NAP * 6;
        let counted = asked.clone();
        let got = l.lock(1, Some(Instant::now() + wait_for), move |_| {
            counted.fetch_add(1, Ordering::Relaxed);
            true
        });
        stop.store(true, Ordering::Relaxed);
        waker.join().unwrap();
        assert!(got.is_none(), "a live holder keeps the lock");
        let n = asked.load(Ordering::Relaxed);
        assert!(
            n <= 7,
            "the live holder's token was asked {n} times in 6 naps"
        );
    }
}
