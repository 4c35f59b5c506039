//! Spinning before a sleep: without yielding the CPU, and only while it pays.
//!
//! A waiter that spins for a few microseconds before it sleeps on a futex catches an answer
//! that comes quickly (a request/response loop on a machine with a free core) without the
//! two wake-ups a sleep costs. Five things make a spin harmful, or useless:
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
//!   its answer turns spinning back on. A reader's spin that saw a commit counts as caught
//!   only if the reader then found a message ([`crate::queue::Queue::settle_read_spin`]):
//!   an idle worker that sees every commit another worker takes would spin on for them.
//! * **Spinning for less time than the answer takes.** How long an answer takes is the
//!   other side's work plus, when the waiter sleeps, the machine's cost of waking it: a few
//!   microseconds on a quiet machine with fast wake-ups, 50–100 µs on a virtual machine
//!   whose idle virtual CPUs are woken through the hypervisor. A fixed spin shorter than the
//!   other side's turn never catches, so every answer pays that wake-up (a request/response
//!   loop there ran at 170 µs a round trip with a 20 µs spin, at 23 µs with 150 µs). So
//!   each policy also keeps a running mean of how long its waits took
//!   ([`SpinPolicy::learn`]), and a spin lasts up to twice that, never less than the
//!   handle's own spin and never more than [`SPIN_CAP`] ([`SpinPolicy::budget`]). The
//!   mean is learned from the waits that did not spin (their whole length, wake-up
//!   included) and from the spins that caught their answer (until it came), not from the
//!   spins that missed: on a machine where both sides share one core, the spinner itself
//!   kept the answer from coming, and learning that time would only lengthen the next
//!   spin. There a sleeping wait is short (the other side's work on the same core), so the
//!   spin stays short too, and misses turn it off as above.
//! * **Spinning while every CPU has work.** A consumer whose producers keep every CPU busy
//!   would catch each result by spinning, and take that CPU time from the producers: its
//!   results come later, and the spin still catches. So a spin longer than the handle's own
//!   looks first whether a CPU is free ([`a_cpu_is_free`]: fewer runnable threads on the
//!   machine, this one aside, than CPUs this process may use; one read of `/proc/loadavg`,
//!   about a microsecond), and keeps to the handle's spin otherwise.
//! * **Spinning on a CPU that another thread wants.** A spinner that finds it was
//!   descheduled (a gap between two looks at the clock: [`Spun::Descheduled`]) stops at
//!   once and counts a miss, even if the answer came meanwhile: on a shared core the answer
//!   comes only while the spinner is off its CPU, so a spin there only delays it. An answer
//!   found after a shorter gap ([`CATCH_GAP`], below the partner's turn) is no catch either:
//!   the partner gave it while the spinner was off its CPU (counted as a catch, it kept
//!   spinning on for a request/response loop on one core). A spinner is seldom descheduled,
//!   though, while the thread it waits for is already runnable on its CPU (the scheduler
//!   preempts at a wake-up or a tick, milliseconds apart), so such a spin runs its whole
//!   length. So a probe (a spin while spinning is off, [`Spin::Probe`]) of a process that
//!   may use one CPU only spins only where no other thread is runnable
//!   ([`a_probe_may_spin`]), and one that does not spin counts as a miss: a request/response
//!   loop whose two sides share one core otherwise lost the handle's whole spin (20 µs, a
//!   round trip's length) once in [`PROBE_MAX`] round trips.
//!
//! A queue's reader that spins also tells the queue's writers so
//! ([`crate::queue`]'s `spinners`): the next commit, which the spinner will take, then wakes
//! no sleeping reader, so the readers whose spins stopped paying sleep on undisturbed.
//!
//! The policy lives in each process's handle (plain atomics, no shared memory): a process's
//! verdict on its own waits says nothing to another's.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Spins that ended in a sleep, in a row, after which a waiter stops spinning.
pub const MISS_LIMIT: u32 = 2;

/// While spinning is off, at least one wait in this many still spins (a probe).
pub const PROBE_MAX: u32 = 64;

/// The longest spin a learned wait length asks for ([`SpinPolicy::budget`]): about the
/// dearest wake-up of a virtual machine, so that a probe that misses costs little more
/// than one such wake-up.
pub const SPIN_CAP: Duration = Duration::from_micros(200);

/// Whether the waits of one side of a handle spin first.
#[derive(Debug, Default)]
pub struct SpinPolicy {
    /// Spins in a row that ended in a sleep (saturating). Below [`MISS_LIMIT`]: every wait
    /// spins; from it on: only probes do, one in `2^(misses - MISS_LIMIT + 1)` waits, at most
    /// one in [`PROBE_MAX`].
    misses: AtomicU32,
    /// Waits that did not spin since the last probe.
    skipped: AtomicU32,
    /// Running mean of how long a wait took, in nanoseconds (0: none learned yet): a
    /// quarter of each new length ([`SpinPolicy::learn`]). Read and written with relaxed
    /// ordering; two threads learning at once may lose one sample, which only delays the
    /// mean.
    typical_ns: AtomicU64,
}

/// Whether a wait spins before it sleeps ([`SpinPolicy::should_spin`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spin {
    /// It sleeps at once (spinning is off, and this wait is no probe).
    No,
    /// Spinning is on: the last spins caught their answers, or too few missed.
    On,
    /// Spinning is off, and this wait is one of the few that look whether it pays again,
    /// where it may ([`a_probe_may_spin`], see the module).
    Probe,
}

impl SpinPolicy {
    /// Whether the wait about to start should spin before it sleeps.
    pub fn should_spin(&self) -> Spin {
        let misses = self.misses.load(Ordering::Relaxed);
        if misses < MISS_LIMIT {
            return Spin::On;
        }
        let every = (2u32 << (misses - MISS_LIMIT).min(5)).min(PROBE_MAX);
        let skipped = self.skipped.fetch_add(1, Ordering::Relaxed) + 1;
        if skipped >= every {
            self.skipped.store(0, Ordering::Relaxed);
            return Spin::Probe;
        }
        Spin::No
    }

    /// Whether the wait about to start spins ([`SpinPolicy::should_spin`]), asking
    /// `probe_may_spin` ([`a_probe_may_spin`]) for a probe only; a probe that may not
    /// counts as a miss, so probes grow rarer as after a spin that missed.
    pub fn spins(&self, probe_may_spin: impl FnOnce() -> bool) -> bool {
        match self.should_spin() {
            Spin::On => true,
            Spin::No => false,
            Spin::Probe => {
                let may = probe_may_spin();
                if !may {
                    self.record(false);
                }
                may
            }
        }
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

    /// How long the next spin may last, given the handle's own spin `base`: twice the
    /// learned wait length, at least `base`, at most [`SPIN_CAP`] (never less than `base`,
    /// even above the cap).
    pub fn budget(&self, base: Duration) -> Duration {
        let learned = Duration::from_nanos(self.typical_ns.load(Ordering::Relaxed));
        base.max(learned.saturating_mul(2).min(SPIN_CAP))
    }

    /// A wait ended with its answer after `waited`: a sleep that did not spin, or a spin that
    /// caught it (not a spin that missed, nor a wait that timed out: see the module).
    pub fn learn(&self, waited: Duration) {
        let x = u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX);
        let old = self.typical_ns.load(Ordering::Relaxed);
        let new = if old == 0 {
            x.max(1)
        } else if x >= old {
            old + (x - old) / 4
        } else {
            old - (old - x) / 4
        };
        self.typical_ns.store(new.max(1), Ordering::Relaxed);
    }

    /// Spins in a row that ended in a sleep (tests).
    #[cfg(test)]
    pub fn misses(&self) -> u32 {
        self.misses.load(Ordering::Relaxed)
    }
}

/// Whether a CPU is free for a spinner: fewer runnable threads on the machine than the CPUs
/// this process may use, the calling (running) thread aside. False where it cannot be told
/// (no `/proc`): spins then keep to the handle's own length.
pub fn a_cpu_is_free() -> bool {
    static LOADAVG: OnceLock<Option<File>> = OnceLock::new();
    let Some(file) = LOADAVG.get_or_init(|| File::open("/proc/loadavg").ok()) else {
        return false;
    };
    let mut buf = [0u8; 128];
    let Ok(n) = file.read_at(&mut buf, 0) else {
        return false;
    };
    runnable(&buf[..n]).is_some_and(|r| r.saturating_sub(1) < usable_cpus())
}

/// The CPUs this process may use (its affinity, or its cgroup's quota), asked once.
fn usable_cpus() -> usize {
    static CPUS: OnceLock<usize> = OnceLock::new();
    *CPUS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Whether a probe may spin ([`Spin::Probe`]): unless this process may use one CPU only and
/// another thread is runnable, which on that CPU can only be waiting for it (see the
/// module). Elsewhere the answering side may run on another CPU while the spinner waits,
/// as beside busy processes, where a probe that catches its answer spares the wake-ups of
/// an idle CPU.
pub fn a_probe_may_spin() -> bool {
    usable_cpus() > 1 || a_cpu_is_free()
}

/// The runnable threads in a `/proc/loadavg` line (`"0.52 0.58 0.59 3/467 12345"`: its
/// fourth field's first number), or None if the line is not one.
fn runnable(line: &[u8]) -> Option<usize> {
    let field = std::str::from_utf8(line)
        .ok()?
        .split_ascii_whitespace()
        .nth(3)?;
    field.split_once('/')?.0.parse().ok()
}

/// A gap this long between two looks at the clock (a fraction of a microsecond apart while
/// a spin runs: [`PAUSES_PER_LOOK`]) means the spinner was descheduled meanwhile: its CPU is
/// wanted by another thread, and the spin stops.
pub const DESCHEDULED_GAP: Duration = Duration::from_micros(20);

/// A gap this long before the look that found the answer means the answer came while the
/// spinner was off its CPU: no catch ([`Spun::Descheduled`]). Below the shortest turn of a
/// partner sharing the spinner's core (two context switches and its side's work: 8 µs and
/// more for a Python loop), so that on a shared core spinning turns off, where each spin
/// only delays the answer; far above the time between two looks. (A spin goes on through
/// shorter gaps than [`DESCHEDULED_GAP`]: stopping one early may cost a wake-up.)
pub const CATCH_GAP: Duration = Duration::from_micros(5);

/// Pause instructions between two looks at the clock while a spin runs: 0.1–0.5 µs.
pub const PAUSES_PER_LOOK: u32 = 8;

/// What a spin ([`spin_until`]) ended in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spun {
    /// `done()` held, and the spinner kept its CPU throughout (no gap of [`CATCH_GAP`]
    /// before it held).
    Caught,
    /// The time was up.
    Missed,
    /// The spinner lost its CPU for a while: the spin ends at once, after a gap of
    /// [`DESCHEDULED_GAP`] (whether `done()` holds now is the caller's to look), or `done()`
    /// held after a gap of [`CATCH_GAP`]. Its CPU is shared with another runnable thread,
    /// perhaps the one it waits for, whose answer then came while the spinner was off the
    /// CPU: spinning there only delays the answer, so the policy counts it as a miss
    /// whatever the answer did meanwhile.
    Descheduled,
}

/// Spins on the CPU (pause instructions, never a system call that gives the CPU away) until
/// `done()`, until `until`, or until it finds it was descheduled meanwhile ([`Spun`]).
pub fn spin_until(until: Instant, done: impl Fn() -> bool) -> Spun {
    let mut last = Instant::now();
    loop {
        for _ in 0..PAUSES_PER_LOOK {
            if done() {
                // Caught only if this thread kept its CPU until now: on a core shared with
                // the answering side, the answer comes while the spinner is descheduled.
                if last.elapsed() >= CATCH_GAP {
                    return Spun::Descheduled;
                }
                return Spun::Caught;
            }
            std::hint::spin_loop();
        }
        let now = Instant::now();
        if now.saturating_duration_since(last) >= DESCHEDULED_GAP {
            return Spun::Descheduled;
        }
        if now >= until {
            return if done() { Spun::Caught } else { Spun::Missed };
        }
        last = now;
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
        assert_eq!(p.should_spin(), Spin::On);
        p.record(false);
        assert_eq!(p.should_spin(), Spin::On, "one miss is not enough to stop");
        p.record(false);
        assert_eq!(p.misses(), MISS_LIMIT);
        // Off: one wait in two is a probe, then one in four after that probe missed.
        let first: Vec<Spin> = (0..4).map(|_| p.should_spin()).collect();
        assert_eq!(first, [Spin::No, Spin::Probe, Spin::No, Spin::Probe]);
        p.record(false);
        let next: Vec<Spin> = (0..8).map(|_| p.should_spin()).collect();
        assert_eq!(
            next.iter().filter(|s| **s == Spin::Probe).count(),
            2,
            "{next:?}"
        );
        assert!(!next.contains(&Spin::On), "{next:?}");
        // Probes never grow rarer than one in PROBE_MAX.
        for _ in 0..100 {
            p.record(false);
        }
        let probes = (0..PROBE_MAX * 3)
            .filter(|_| p.should_spin() == Spin::Probe)
            .count();
        assert_eq!(probes, 3);
        // One probe that catches its answer turns spinning back on for every wait.
        p.record(true);
        assert!((0..10).all(|_| p.should_spin() == Spin::On));
    }

    #[test]
    fn a_probe_spins_only_where_it_may_and_one_that_may_not_is_a_miss() {
        let p = SpinPolicy::default();
        // On: spins without asking.
        assert!(p.spins(|| panic!("asked while spinning is on")));
        p.record(false);
        p.record(false);
        // Off: the waits between probes sleep without asking; a probe asks.
        assert!(!p.spins(|| panic!("asked between probes")));
        assert!(!p.spins(|| false));
        assert_eq!(
            p.misses(),
            MISS_LIMIT + 1,
            "a probe that may not spin was no miss"
        );
        // Probes grew rarer: one in four now, then one in eight, as after probes that spun
        // and missed.
        let asked = std::cell::Cell::new(Vec::new());
        for k in 0..12 {
            p.spins(|| {
                asked.set([asked.take(), vec![k]].concat());
                false
            });
        }
        assert_eq!(asked.take(), [3, 11]);
        // A probe that may spin spins, and a catch turns spinning on.
        let mut waits = 0;
        while !p.spins(|| true) {
            waits += 1;
            assert!(waits <= PROBE_MAX, "no probe in {waits} waits");
        }
        p.record(true);
        assert!(p.spins(|| panic!("asked while spinning is on")));
    }

    #[test]
    fn a_spin_lasts_twice_the_learned_wait_within_the_handles_spin_and_the_cap() {
        let base = Duration::from_micros(20);
        let p = SpinPolicy::default();
        assert_eq!(p.budget(base), base, "nothing learned: the handle's spin");
        p.learn(Duration::from_micros(60)); // the first length is taken whole
        assert_eq!(p.budget(base), Duration::from_micros(120));
        p.learn(Duration::from_micros(20)); // then a quarter of each new one
        assert_eq!(p.budget(base), Duration::from_micros(100));
        // Short waits (a fast machine): never below the handle's own spin.
        for _ in 0..100 {
            p.learn(Duration::from_micros(2));
        }
        assert_eq!(p.budget(base), base);
        // Long waits (slow answers, or a dear wake-up): at most the cap...
        for _ in 0..100 {
            p.learn(Duration::from_millis(10));
        }
        assert_eq!(p.budget(base), SPIN_CAP);
        // ...unless the handle's own spin is longer; a zero-length wait is learned as one.
        assert_eq!(p.budget(SPIN_CAP * 2), SPIN_CAP * 2);
        let q = SpinPolicy::default();
        q.learn(Duration::ZERO);
        q.learn(Duration::from_micros(40));
        assert_eq!(q.budget(base), Duration::from_micros(20));
    }

    #[test]
    fn spin_until_ends_at_its_time_or_when_done() {
        // (A test machine under load may deschedule the spinner: that is a verdict too.)
        let start = Instant::now();
        let spun = spin_until(start + Duration::from_millis(2), || false);
        assert_ne!(spun, Spun::Caught);
        if spun == Spun::Missed {
            assert!(start.elapsed() >= Duration::from_millis(2));
        }
        let n = AtomicU32::new(0);
        let spun = spin_until(Instant::now() + Duration::from_secs(60), || {
            n.fetch_add(1, Ordering::Relaxed) >= 100
        });
        assert_ne!(spun, Spun::Missed);
        assert!(spun == Spun::Descheduled || n.load(Ordering::Relaxed) == 101);
        assert!(spin_rounds(12, || true));
        assert!(!spin_rounds(12, || false));
    }

    #[test]
    fn the_runnable_count_is_read_from_a_loadavg_line() {
        assert_eq!(runnable(b"0.52 0.58 0.59 3/467 12345\n"), Some(3));
        assert_eq!(runnable(b"1.18 0.97 0.64 1/79 7853"), Some(1));
        assert_eq!(runnable(b"0.52 0.58 0.59"), None);
        assert_eq!(runnable(b"0.52 0.58 0.59 x/467 1"), None);
        assert_eq!(runnable(b"\xff\xfe"), None);
        // On this machine: the running test thread counts itself, so the line is there.
        if let Ok(line) = std::fs::read("/proc/loadavg") {
            assert!(runnable(&line).is_some_and(|r| r >= 1), "{line:?}");
        }
    }

    #[test]
    fn a_spinner_that_loses_its_cpu_stops_spinning_at_once() {
        // A sleep inside done() stands in for the scheduler taking the CPU away.
        let start = Instant::now();
        let n = AtomicU32::new(0);
        let spun = spin_until(start + Duration::from_secs(60), || {
            if n.fetch_add(1, Ordering::Relaxed) == 40 {
                std::thread::sleep(DESCHEDULED_GAP * 5);
            }
            false
        });
        assert_eq!(spun, Spun::Descheduled);
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "it spun on to its time"
        );
    }

    #[test]
    fn an_answer_that_came_while_the_spinner_was_off_its_cpu_is_no_catch() {
        // The answer comes during the stand-in for a partner's turn on the spinner's core
        // (a sleep inside done()): before, the spin counted it as caught, and spinning stayed
        // on where it only delays every answer.
        let n = AtomicU32::new(0);
        let spun = spin_until(Instant::now() + Duration::from_secs(60), || {
            if n.fetch_add(1, Ordering::Relaxed) == 3 {
                std::thread::sleep(CATCH_GAP * 3);
                return true;
            }
            false
        });
        assert_eq!(spun, Spun::Descheduled);
        // An answer that comes while the spinner runs is caught.
        let n = AtomicU32::new(0);
        let spun = spin_until(Instant::now() + Duration::from_secs(60), || {
            n.fetch_add(1, Ordering::Relaxed) >= 3
        });
        assert!(matches!(spun, Spun::Caught | Spun::Descheduled), "{spun:?}");
    }
}
