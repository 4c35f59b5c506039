//! A spinning reader's claim on the next commit, so that a commit it will take wakes no
//! sleeping reader (the header's `reader_spin_until`).
//!
//! A request/response loop with several workers keeps one of them hot: the worker that
//! returned the last result spins for the next request, and the others, whose spins never
//! catch anything, sleep ([`crate::spin`]). Without the claim every request woke a sleeper
//! as well: the caller paid a futex wake (an inter-processor interrupt, tens of
//! microseconds of its own CPU on a virtual machine), and the sleeper woke, found the
//! request taken by the spinner and slept again, on a CPU the spinner or the caller
//! needed. Two workers on 2 cores ran at about half the round trips a second of one.
//!
//! The protocol, all in sequentially consistent order:
//! * A reader about to spin stores the time its spin ends (`claim`). When the spin ends,
//!   caught or not, it sets the word back to 0 if it still holds its own value (`withdraw`),
//!   and only then looks at the wake-up word once more before it sleeps (as every waiter
//!   does: `Queue::wait_for`).
//! * A writer bumps the wake-up word at each commit, then takes the claim (`take`): a
//!   compare-and-swap of the value it read to 0. If that succeeds, it wakes one sleeping
//!   reader fewer for this commit.
//!
//! Why no commit is left unseen: a writer whose swap succeeded took the value before the
//! spinner's withdrawal, so the wake-up word's bump (before the swap) comes before the
//! spinner's last look at the word (after its withdrawal): the spinner sees the change, in
//! its spin or in that look, and reads. A withdrawal that comes first makes the writer's
//! swap fail, and the writer wakes sleepers as it always did. Each claim is taken by one
//! commit at most, so a batch of commits wakes sleepers for all but one.
//!
//! What can go wrong, and what it costs:
//! * **The spinner dies, or is stopped, after a writer took its claim**: that commit's
//!   message waits for a sleeping reader's next look, at most one recovery tick (every
//!   sleep ends after one, `Queue::wait_for`), or for the spinner's next read; nothing is
//!   lost.
//! * **A claim left behind** (its spinner died before withdrawing it): a writer trusts a
//!   claim only while its end lies in the future, by at most [`CLAIM_MAX`] (one clock for
//!   every process of the machine: CLOCK_MONOTONIC), and clears any other, so a stale or
//!   garbage value costs at most the one commit above.
//! * **Two readers spin at once**: the word holds the claim of the one that started last;
//!   the other's withdrawal fails and leaves it. One claim, one commit: never more commits
//!   go unwoken than readers that look for them.
//! * **A reader that gives up its read after its wait** (Ctrl-C in the caller's thread):
//!   as a dead spinner, one message waits a tick at most.
//! * **Another user** cannot map the queue (its segment is the owner's alone,
//!   `crate::trust`); a process of the same user can write anything to the header anyway.

use super::Queue;
use crate::wait::monotonic_ns;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// The longest spin a claim announces, and the furthest in the future a writer trusts one:
/// a spin may last longer ([`crate::spin::SPIN_CAP`] or a handle's own longer spin), but
/// its claim ends here, and writers wake sleepers as before after that.
pub const CLAIM_MAX: Duration = Duration::from_millis(1);

impl Queue {
    /// A reader about to spin for `len` announces it: the next commit need not wake a
    /// sleeping reader. Returns the claim, to pass to [`Queue::withdraw_spin_claim`] once
    /// the spin ends.
    pub(super) fn claim_spin(&self, len: Duration) -> u64 {
        let len = u64::try_from(len.min(self.claim_max).as_nanos()).unwrap_or(u64::MAX);
        let until = monotonic_ns().saturating_add(len).max(1);
        self.hdr().reader_spin_until.store(until, Ordering::SeqCst);
        until
    }

    /// The spin that made `claim` ended: the claim is withdrawn if it is still there (a
    /// writer may have taken it, or a later spinner put its own). The caller looks at the
    /// wake-up word after this, before it sleeps.
    pub(super) fn withdraw_spin_claim(&self, claim: u64) {
        let _ = self.hdr().reader_spin_until.compare_exchange(
            claim,
            0,
            Ordering::SeqCst,
            Ordering::Relaxed,
        );
    }

    /// A writer that just bumped the wake-up word for a commit takes a spinning reader's
    /// claim on it: true if there was one in force (the commit wakes one sleeper fewer).
    /// A claim out of force (ended, or further ahead than [`CLAIM_MAX`]) is cleared.
    pub(super) fn take_spin_claim(&self) -> bool {
        self.take_spin_claim_at(monotonic_ns())
    }

    /// [`Queue::take_spin_claim`] at the time `now` (CLOCK_MONOTONIC nanoseconds).
    pub(super) fn take_spin_claim_at(&self, now: u64) -> bool {
        let word = &self.hdr().reader_spin_until;
        let until = word.load(Ordering::SeqCst);
        if until == 0 {
            return false;
        }
        let max = u64::try_from(self.claim_max.as_nanos()).unwrap_or(u64::MAX);
        let in_force = until > now && until - now <= max;
        word.compare_exchange(until, 0, Ordering::SeqCst, Ordering::Relaxed)
            .is_ok()
            && in_force
    }

    /// The claim in the header (tests).
    #[cfg(test)]
    pub(super) fn spin_claim(&self) -> u64 {
        self.hdr().reader_spin_until.load(Ordering::SeqCst)
    }

    /// Sets the claim word to `v` (tests: a claim left by a dead reader, or garbage).
    #[cfg(test)]
    pub(super) fn set_spin_claim(&self, v: u64) {
        self.hdr().reader_spin_until.store(v, Ordering::SeqCst);
    }

    /// Sets this handle's [`Queue::claim_max`] (tests).
    #[cfg(test)]
    pub(super) fn set_claim_max(&mut self, max: Duration) {
        self.claim_max = max;
    }

    /// Commits of this handle that woke sleeping readers (tests).
    #[cfg(test)]
    pub(super) fn reader_wakes(&self) -> u64 {
        self.reader_wakes.load(Ordering::Relaxed)
    }
}
