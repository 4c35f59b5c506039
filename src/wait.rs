//! The portable OS layer under every blocking call: wait until a 32-bit word in (shared)
//! memory changes, wake its waiters; and this process's id, cached. (Whether another process
//! is alive is [`crate::liveness`]'s job, never `kill(pid, 0)`'s.)
//!
//! On Linux the wait is a futex on a word that may live in a `MAP_SHARED` mapping, so it works
//! across processes (no `FUTEX_PRIVATE_FLAG`). Elsewhere a short sleep-and-recheck loop stands
//! in (correct, slower); a macOS port replaces only this file (`os_sync_wait_on_address`).
//!
//! Callers use the usual pattern, which cannot lose a wake-up: read the word, check the
//! condition it guards, then `wait(word, seen, ..)` — the kernel returns at once if the word no
//! longer holds `seen`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Once;
use std::time::Duration;

/// Blocks while `*word == expected`, for at most `timeout` (forever if `None`).
/// Returns early on a wake-up, a change of the word, a signal, or spuriously: callers loop.
pub fn wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    imp::wait(word, expected, timeout)
}

/// Wakes every thread (in any process) blocked in [`wait`] on `word`.
pub fn wake_all(word: &AtomicU32) {
    imp::wake(word, i32::MAX)
}

/// Wakes at most one thread blocked in [`wait`] on `word`.
pub fn wake_one(word: &AtomicU32) {
    imp::wake(word, 1)
}

/// Wakes at most `n` threads blocked in [`wait`] on `word`.
pub fn wake(word: &AtomicU32, n: u32) {
    imp::wake(word, n.min(i32::MAX as u32) as i32)
}

#[cfg(target_os = "linux")]
mod imp {
    use super::*;

    pub fn wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
        let ts = timeout.map(|d| libc::timespec {
            tv_sec: d.as_secs().min(i64::MAX as u64) as libc::time_t,
            tv_nsec: d.subsec_nanos() as libc::c_long,
        });
        let ts_ptr = ts
            .as_ref()
            .map_or(std::ptr::null(), |t| t as *const libc::timespec);
        // SAFETY: `word` is a valid, aligned 4-byte atomic for the duration of the call; the
        // kernel only reads it. `ts_ptr` is null or points to a live timespec. A shared
        // (non-private) futex is required because the word may be mapped by other processes.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAIT,
                expected,
                ts_ptr,
                std::ptr::null::<u32>(),
                0u32,
            );
        }
    }

    pub fn wake(word: &AtomicU32, n: i32) {
        // SAFETY: as above; FUTEX_WAKE only uses the address as a key.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAKE,
                n,
                std::ptr::null::<libc::timespec>(),
                std::ptr::null::<u32>(),
                0u32,
            );
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    use super::*;
    use std::time::Instant;

    pub fn wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
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

    pub fn wake(_word: &AtomicU32, _n: i32) {}
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
}
