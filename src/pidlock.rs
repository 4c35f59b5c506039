//! A short lock in shared memory that survives the death of its holder.
//!
//! The lock word holds the pid of its holder (0 when free) and is taken by compare-and-swap.
//! Waiters spin briefly, then sleep on the word in 10 ms naps; a waiter that finds the same
//! pid still holding it after a nap checks whether that process is alive (`kill(pid, 0)`) and
//! takes the lock over if it is not. So a SIGKILLed holder never blocks the others for longer
//! than a nap. Callers keep every update made under the lock ordered so that any prefix of it
//! leaves their data consistent: a takeover then sees a valid state.
//!
//! Threads of one process share a pid, so the lock is not reentrant and must only guard short,
//! non-blocking sections.

use crate::wait::{self, current_pid, pid_alive};
use crossbeam_utils::Backoff;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// The lock's two words, `#[repr(C)]` so that it can live in a shared-memory layout.
#[repr(C)]
pub struct PidLock {
    /// pid of the holder, 0 when free.
    word: AtomicU32,
    /// threads asleep on `word`.
    waiters: AtomicU32,
}

/// Holds a [`PidLock`] until dropped.
pub struct PidLockGuard<'a> {
    lock: &'a PidLock,
}

impl Drop for PidLockGuard<'_> {
    fn drop(&mut self) {
        self.lock.word.store(0, Ordering::Release);
        if self.lock.waiters.load(Ordering::SeqCst) > 0 {
            wait::wake_one(&self.lock.word);
        }
    }
}

impl PidLock {
    /// Takes the lock, taking it over from a holder that died.
    pub fn lock(&self) -> PidLockGuard<'_> {
        let me = current_pid();
        let word = &self.word;
        if word
            .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            return PidLockGuard { lock: self };
        }
        let backoff = Backoff::new();
        loop {
            let cur = word.load(Ordering::Relaxed);
            if cur == 0 {
                if word
                    .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    return PidLockGuard { lock: self };
                }
                continue;
            }
            if !backoff.is_completed() {
                backoff.snooze();
                continue;
            }
            self.waiters.fetch_add(1, Ordering::SeqCst);
            wait::wait(word, cur, Some(Duration::from_millis(10)));
            self.waiters.fetch_sub(1, Ordering::SeqCst);
            // Still held by the same pid after a long wait: take it over if that process died.
            if word.load(Ordering::Relaxed) == cur
                && !pid_alive(cur)
                && word
                    .compare_exchange(cur, me, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return PidLockGuard { lock: self };
            }
        }
    }

    /// The holder's pid, 0 when free (tests).
    #[cfg(test)]
    pub fn holder(&self) -> u32 {
        self.word.load(Ordering::SeqCst)
    }

    /// Marks the lock as held by `pid` (tests: simulate a holder that died).
    #[cfg(test)]
    pub fn force_holder(&self, pid: u32) {
        self.word.store(pid, Ordering::SeqCst);
    }
}
