//! The portable OS layer under every blocking call: wait until a 32-bit word in (shared)
//! memory changes, wake its waiters; and this process's id, cached. (Whether another process
//! is alive is [`crate::liveness`]'s job, never `kill(pid, 0)`'s.)
//!
//! On Linux the wait is a futex on a word that may live in a `MAP_SHARED` mapping, so it works
//! across processes (no `FUTEX_PRIVATE_FLAG`). Elsewhere a short sleep-and-recheck loop stands
//! in (correct, slower); a macOS port replaces only this file (`os_sync_wait_on_address`).
//!
//! A waiter may carry a tag (bits of a futex bitset) so that a waker can pick it out of the
//! others on the same word, and fall back to waking any when the one it picked is gone.
//!
//! Callers use the usual pattern, which cannot lose a wake-up: read the word, check the
//! condition it guards, then `wait(word, seen, ..)` — the kernel returns at once if the word no
//! longer holds `seen`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Once;
use std::time::Duration;

/// The tag of a plain wait or wake: every bit (the kernel's `FUTEX_BITSET_MATCH_ANY`).
const ANY: u32 = u32::MAX;

/// Blocks while `*word == expected`, for at most `timeout` (forever if `None`).
/// Returns early on a wake-up, a change of the word, a signal, or spuriously: callers loop.
pub fn wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    imp::wait_tagged(word, expected, timeout, ANY)
}

/// Wakes every thread (in any process) blocked in [`wait`] on `word`.
pub fn wake_all(word: &AtomicU32) {
    wake(word, u32::MAX);
}

/// Wakes at most one thread blocked in [`wait`] on `word`.
pub fn wake_one(word: &AtomicU32) {
    wake(word, 1);
}

/// Wakes at most `n` threads blocked in [`wait`] on `word`.
pub fn wake(word: &AtomicU32, n: u32) {
    wake_tagged(word, n, ANY);
}

/// [`wait`], tagged with the bits `tag` (not 0): a [`wake_tagged`] whose bits meet them
/// may pick this waiter out of the others on `word`; any plain wake wakes it as well.
pub fn wait_tagged(word: &AtomicU32, expected: u32, timeout: Option<Duration>, tag: u32) {
    imp::wait_tagged(word, expected, timeout, tag)
}

/// Wakes at most `n` threads blocked on `word` whose tags meet `bits` (a plain [`wait`] has
/// every bit). Returns how many it woke: 0 where the chosen waiters are gone (dead, woken,
/// timed out) or the platform has no tagged waits, so the caller falls back to [`wake`].
pub fn wake_tagged(word: &AtomicU32, n: u32, bits: u32) -> u32 {
    imp::wake_tagged(word, n.min(i32::MAX as u32) as i32, bits)
}

#[cfg(target_os = "linux")]
mod imp {
    use super::*;

    /// One futex call on `word` (the bitset forms: `bits` selects waiters; a wait's
    /// deadline is absolute, on CLOCK_MONOTONIC). Returns the kernel's answer.
    fn futex(
        word: &AtomicU32,
        op: libc::c_int,
        val: u32,
        deadline: Option<&libc::timespec>,
        bits: u32,
    ) -> libc::c_long {
        let ts_ptr = deadline.map_or(std::ptr::null(), |t| t as *const libc::timespec);
        // SAFETY: `word` is a valid, aligned 4-byte atomic for the duration of the call; the
        // kernel only reads it, or uses its address as a key. `ts_ptr` is null or points to
        // a live timespec. A shared (non-private) futex is required because the word may be
        // mapped by other processes. A `bits` of 0 is refused (EINVAL: the call returns at
        // once): callers pass a non-zero one.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                op,
                val,
                ts_ptr,
                std::ptr::null::<u32>(),
                bits,
            )
        }
    }

    pub fn wait_tagged(word: &AtomicU32, expected: u32, timeout: Option<Duration>, tag: u32) {
        let deadline = timeout.map(|d| {
            let at = monotonic_ns().saturating_add(d.as_nanos().min(u64::MAX as u128) as u64);
            libc::timespec {
                tv_sec: (at / 1_000_000_000).min(i64::MAX as u64) as libc::time_t,
                tv_nsec: (at % 1_000_000_000) as libc::c_long,
            }
        });
        futex(
            word,
            libc::FUTEX_WAIT_BITSET,
            expected,
            deadline.as_ref(),
            tag,
        );
    }

    pub fn wake_tagged(word: &AtomicU32, n: i32, bits: u32) -> u32 {
        let woken = futex(word, libc::FUTEX_WAKE_BITSET, n as u32, None, bits);
        u32::try_from(woken).unwrap_or(0)
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    use super::*;
    use std::time::Instant;

    pub fn wait_tagged(word: &AtomicU32, expected: u32, timeout: Option<Duration>, _tag: u32) {
        let start = Instant::now();
        let step = Duration::from_micros(200);
        while word.load(Ordering::Acquire) == expected {
            let left = match timeout {
                Some(t) => match t.checked_sub(start.elapsed()) {
                    Some(l) if !l.is_zero() => l,
                    _ => return,
                },
                None => step,
            };
            std::thread::sleep(left.min(step));
        }
    }

    pub fn wake_tagged(_word: &AtomicU32, _n: i32, _bits: u32) -> u32 {
        0
    }
}

static CACHED_PID: AtomicU32 = AtomicU32::new(0);
static PID_INIT: Once = Once::new();

extern "C" fn refresh_pid_after_fork() {
    // SAFETY: getpid is async-signal-safe and has no preconditions.
    CACHED_PID.store(unsafe { libc::getpid() } as u32, Ordering::Relaxed);
}

/// This process's id, cached (getpid is a system call) and refreshed in a forked child.
pub fn current_pid() -> u32 {
    PID_INIT.call_once(|| {
        refresh_pid_after_fork();
        // SAFETY: registers a plain extern "C" function with no captured state; it only stores
        // to an atomic, which is safe in the child right after fork.
        unsafe {
            libc::pthread_atfork(None, None, Some(refresh_pid_after_fork));
        }
    });
    CACHED_PID.load(Ordering::Relaxed)
}

/// CLOCK_MONOTONIC in nanoseconds: one clock for every process of the machine (and of its
/// containers), unlike `Instant`, which cannot be stored in shared memory.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// Waits (at most a minute, then panics) until thread `tid` of this process is asleep in
/// the kernel (tests: a waiter is in its futex before the wake-up under test is sent).
#[cfg(all(test, target_os = "linux"))]
pub(crate) fn until_asleep(tid: i32, also: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let state = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')
                    .map(|(_, r)| r.trim_start().starts_with('S'))
            });
        if state == Some(true) && also() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "thread {tid} never fell asleep"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn wait_returns_at_once_when_word_differs() {
        let w = AtomicU32::new(5);
        let t = Instant::now();
        wait(&w, 4, Some(Duration::from_secs(5)));
        assert!(t.elapsed() < Duration::from_secs(4));
    }

    #[test]
    fn wake_all_releases_a_waiter() {
        let w = Arc::new(AtomicU32::new(0));
        let w2 = w.clone();
        let h = std::thread::spawn(move || {
            while w2.load(Ordering::SeqCst) == 0 {
                wait(&w2, 0, Some(Duration::from_secs(10)));
            }
            w2.load(Ordering::SeqCst)
        });
        std::thread::sleep(Duration::from_millis(20));
        w.store(7, Ordering::SeqCst);
        wake_all(&w);
        assert_eq!(h.join().unwrap(), 7);
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn a_tagged_wake_picks_its_waiter_and_a_plain_one_any() {
        let w = Arc::new(AtomicU32::new(0));
        let (tx, rx) = std::sync::mpsc::channel();
        let spawn = |tag: u32| {
            let (w, tx) = (w.clone(), tx.clone());
            std::thread::spawn(move || {
                // SAFETY: gettid takes no arguments and cannot fail.
                tx.send(unsafe { libc::gettid() }).unwrap();
                wait_tagged(&w, 0, Some(Duration::from_secs(60)), tag);
            })
        };
        let (a, b) = (spawn(1), spawn(2));
        for _ in 0..2 {
            until_asleep(rx.recv().unwrap(), || true);
        }
        assert_eq!(wake_tagged(&w, 1, 4), 0, "no waiter has bit 4");
        assert_eq!(wake_tagged(&w, 1, 2), 1);
        b.join().unwrap();
        assert!(
            !a.is_finished(),
            "the wake for bit 2 woke the waiter of bit 1"
        );
        assert_eq!(wake_tagged(&w, 1, 2), 0, "its waiter is gone");
        wake(&w, 1);
        a.join().unwrap();
    }
}
