//! Spinning before a sleep: without yielding the CPU, and only while it pays.
//!
//! A waiter that spins for a few microseconds before it sleeps on a futex catches an answer
//! that comes quickly (a request/response loop on a machine with a free core) without the
//! two wake-ups a sleep costs. Two things make a spin harmful instead:
//!
//! * **Yielding while spinning.** `sched_yield` under Linux's fair scheduler (EEVDF) moves
//!   the caller's deadline a whole slice later at every call, so a waiter that yields a few
//!   dozen times while it spins queues itself behind every busy process of the machine and
//!   then waits for their slices (milliseconds) once it sleeps and is woken. On a 2-core
//!   machine with two busy processes, a request/response loop whose waits yielded fell from
//!   about 30,000 round trips a second to a few hundred. So a spin here only runs the CPU's
//!   pause instruction ([`spin_until`]).
//! * **Spinning for an answer that does not come in time.** The time is burnt for nothing,
//!   and counts against the waiter in the scheduler's accounting. [`SpinPolicy`] keeps a
//!   count of the spins that ended in a sleep anyway: after [`MISS_LIMIT`] in a row the
//!   waiter sleeps at once, and spins again only now and then (every 2nd, 4th, … up to
//!   every [`PROBE_MAX`]th wait) to see whether spinning pays again; one spin that catches
//!   its answer turns spinning back on.
//!
//! The policy lives in each process's handle (plain atomics, no shared memory): a process's
//! verdict on its own waits says nothing to another's.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

/// Spins that ended in a sleep, in a row, after which a waiter stops spinning.
pub const MISS_LIMIT: u32 = 2;

/// While spinning is off, at least one wait in this many still spins (a probe).
pub const PROBE_MAX: u32 = 64;

/// Whether the waits of one side of a handle spin first.
#[derive(Debug, Default)]
pub struct SpinPolicy {
    /// Spins in a row that ended in a sleep (saturating). Below [`MISS_LIMIT`]: every wait
    /// spins; from it on: only probes do, one in `2^(misses - MISS_LIMIT + 1)` waits, at most
    /// one in [`PROBE_MAX`].
    misses: AtomicU32,
    /// Waits that did not spin since the last probe.
    skipped: AtomicU32,
}

impl SpinPolicy {
    /// Whether the wait about to start should spin before it sleeps.
    pub fn should_spin(&self) -> bool {
        let misses = self.misses.load(Ordering::Relaxed);
        if misses < MISS_LIMIT {
            return true;
        }
        let every = (2u32 << (misses - MISS_LIMIT).min(5)).min(PROBE_MAX);
        let skipped = self.skipped.fetch_add(1, Ordering::Relaxed) + 1;
        if skipped >= every {
            self.skipped.store(0, Ordering::Relaxed);
            return true;
        }
        false
    }

    /// What a spin ended in: `caught` if the answer came while spinning, else a sleep.
    pub fn record(&self, caught: bool) {
        if caught {
            self.misses.store(0, Ordering::Relaxed);
            self.skipped.store(0, Ordering::Relaxed);
        } else {
            let _ = self
                .misses
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |m| {
                    Some(m.saturating_add(1))
                });
        }
    }

    /// Spins in a row that ended in a sleep (tests).
    #[cfg(test)]
    pub fn misses(&self) -> u32 {
        self.misses.load(Ordering::Relaxed)
    }
}

/// Spins on the CPU (pause instructions, never a system call that gives the CPU away) until
/// `done()` or until `until`; returns whether `done()` held.
pub fn spin_until(until: Instant, done: impl Fn() -> bool) -> bool {
    loop {
        // About a microsecond of pauses between two looks at the clock.
        for _ in 0..32 {
            if done() {
                return true;
            }
            std::hint::spin_loop();
        }
        if Instant::now() >= until {
            return done();
        }
    }
}

/// Spins on the CPU for about `rounds` short rounds of pauses (no clock, no system call)
/// until `done()`; returns whether it held. For a caller that must not wait long at all (a
/// lock taken while holding Python's GIL).
pub fn spin_rounds(rounds: u32, done: impl Fn() -> bool) -> bool {
    for r in 0..rounds {
        if done() {
            return true;
        }
        for _ in 0..(1u32 << r.min(6)) {
            std::hint::spin_loop();
        }
    }
    done()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn spinning_stops_after_misses_and_probes_turn_it_back_on() {
        let p = SpinPolicy::default();
        assert!(p.should_spin());
        p.record(false);
        assert!(p.should_spin(), "one miss is not enough to stop");
        p.record(false);
        assert_eq!(p.misses(), MISS_LIMIT);
        // Off: one wait in two spins (a probe), then one in four after that probe missed.
        let first: Vec<bool> = (0..4).map(|_| p.should_spin()).collect();
        assert_eq!(first.iter().filter(|s| **s).count(), 2, "{first:?}");
        p.record(false);
        let next: Vec<bool> = (0..8).map(|_| p.should_spin()).collect();
        assert_eq!(next.iter().filter(|s| **s).count(), 2, "{next:?}");
        // Probes never grow rarer than one in PROBE_MAX.
        for _ in 0..100 {
            p.record(false);
        }
        let spins = (0..PROBE_MAX * 3).filter(|_| p.should_spin()).count();
        assert_eq!(spins, 3);
        // One probe that catches its answer turns spinning back on for every wait.
        p.record(true);
        assert!((0..10).all(|_| p.should_spin()));
    }

    #[test]
    fn spin_until_ends_at_its_time_or_when_done() {
        let start = Instant::now();
        assert!(!spin_until(start + Duration::from_millis(2), || false));
        assert!(start.elapsed() >= Duration::from_millis(2));
        let n = AtomicU32::new(0);
        assert!(spin_until(Instant::now() + Duration::from_secs(60), || {
            n.fetch_add(1, Ordering::Relaxed) >= 100
        }));
        assert!(spin_rounds(12, || true));
        assert!(!spin_rounds(12, || false));
    }
}
