//! Lifelines: a slot of shared memory that the kernel marks the instant the thread holding it
//! ends, so that another process learns of a death by reading memory, without a system call.
//!
//! A lifeline is a robust, process-shared `pthread_mutex_t` (`PTHREAD_MUTEX_ROBUST`,
//! `PTHREAD_PROCESS_SHARED`) in a [`SLOT_BYTES`] slot of memory that the processes share. Its
//! owner takes it ([`hold`]) in the thread that lives as long as the process (a producer's
//! main thread, before it says it is ready) and never lets go. When that thread ends (the
//! process exits, is killed, or execs), the kernel walks the thread's robust list and marks
//! the mutex "owner died". Another process [`look`]s with a `trylock`, which makes no system
//! call:
//! * busy: the holder lives ([`Look::Held`]); a stopped process (SIGSTOP, a debugger) is alive;
//! * "owner died": the holder ended ([`Look::Dead`]); the look frees the mutex (made consistent
//!   and let go of), so later looks say free. (Not left "not recoverable": glibc's trylock of
//!   such a mutex keeps it locked by the caller, and the caller's next trylock says busy.)
//! * free: nobody holds it ([`Look::Free`]; the look lets go of it at once).
//!
//! What a look can and cannot be trusted for:
//! * Dead is the kernel's word, made at thread exit, *before* the process's files are closed:
//!   a lifeline may say dead a moment before the process's sentinel (a pipe or pidfd) does.
//! * Held is only as good as the holder's robust list: a process that corrupts its own memory
//!   may end unmarked, and then looks say it lives. Users therefore treat Held as a fast "all
//!   alive" answer whose error must cost no more than a death noticed later (the pool: a call
//!   fails loudly instead of restarting quietly), never as the end of a wait; waits watch the
//!   sentinel.
//! * Another user cannot reach a lifeline: it lives in memory without a name (a memfd, or a
//!   0600 file unlinked as soon as it was made, inherited or passed by descriptor).
//! * Looks by threads of one process must not overlap (two at once on a dead mutex: the second
//!   sees the first's transient hold as busy). The bindings serialize them under the GIL.
//! * A slot must not be made again ([`init`]) while a process that held it may still live: the
//!   kernel walks a robust list through pointers kept in the mutex itself.
//!
//! Lifelines are for Linux (robust mutexes elsewhere are absent or differ): elsewhere
//! [`SUPPORTED`] is false, [`init`] fails and a look says [`Look::Free`].

use std::io;

/// Bytes a lifeline takes in shared memory (a `pthread_mutex_t` and spare room), 8-aligned.
pub const SLOT_BYTES: usize = 64;

/// Whether lifelines work on this platform.
pub const SUPPORTED: bool = cfg!(target_os = "linux");

#[cfg(target_os = "linux")]
const _: () = assert!(std::mem::size_of::<libc::pthread_mutex_t>() <= SLOT_BYTES);
#[cfg(target_os = "linux")]
const _: () = assert!(std::mem::align_of::<libc::pthread_mutex_t>() <= 8);

/// What a look at a lifeline found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Look {
    /// A live thread holds it.
    Held,
    /// Its holder ended (this look is the first to see it: it freed the mutex).
    Dead,
    /// Nobody holds it (not yet, or no longer).
    Free,
}

/// Makes the slot at `slot` a free lifeline.
///
/// # Safety
/// `slot` points to [`SLOT_BYTES`] writable bytes, 8-aligned, that stay mapped while the
/// call runs; no thread of any process uses the slot meanwhile, and no process that held a
/// lifeline there may still be alive (see the module).
pub unsafe fn init(slot: *mut u8) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        let mut attr = std::mem::MaybeUninit::<libc::pthread_mutexattr_t>::uninit();
        let a = attr.as_mut_ptr();
        // SAFETY: `a` points to an attribute object of our own, initialized first and destroyed
        // last; `slot` is valid for a mutex by the caller's contract.
        unsafe {
            check(libc::pthread_mutexattr_init(a))?;
            let made = check(libc::pthread_mutexattr_setpshared(
                a,
                libc::PTHREAD_PROCESS_SHARED,
            ))
            .and_then(|()| {
                check(libc::pthread_mutexattr_setrobust(
                    a,
                    libc::PTHREAD_MUTEX_ROBUST,
                ))
            })
            .and_then(|()| {
                std::ptr::write_bytes(slot, 0, SLOT_BYTES);
                check(libc::pthread_mutex_init(slot.cast(), a))
            });
            libc::pthread_mutexattr_destroy(a);
            made
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = slot;
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }
}

/// Takes the lifeline at `slot` for the calling thread, without waiting: true if taken (it
/// was free, or its holder had died: then it is made consistent and is the caller's); false
/// if a live thread holds it. The caller's thread must live as long as its process.
///
/// # Safety
/// `slot` was made by [`init`] and stays mapped for as long as the calling thread lives.
pub unsafe fn hold(slot: *mut u8) -> io::Result<bool> {
    #[cfg(target_os = "linux")]
    {
        let m: *mut libc::pthread_mutex_t = slot.cast();
        // SAFETY: `m` is an initialized process-shared mutex by the caller's contract.
        match unsafe { libc::pthread_mutex_trylock(m) } {
            0 => Ok(true),
            libc::EBUSY => Ok(false),
            // SAFETY: the trylock made this thread its holder; marking it consistent keeps it.
            libc::EOWNERDEAD => check(unsafe { libc::pthread_mutex_consistent(m) }).map(|()| true),
            e => Err(io::Error::from_raw_os_error(e)),
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = slot;
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }
}

/// Whether the lifeline at `slot` is held, its holder dead, or free (see the module). Looks
/// by threads of one process must not overlap.
///
/// # Safety
/// `slot` was made by [`init`] and stays mapped while the call runs.
pub unsafe fn look(slot: *mut u8) -> Look {
    #[cfg(target_os = "linux")]
    {
        let m: *mut libc::pthread_mutex_t = slot.cast();
        // SAFETY: `m` is an initialized process-shared mutex by the caller's contract; a lock
        // the trylock takes is let go of at once (after "owner died", made consistent first).
        unsafe {
            match libc::pthread_mutex_trylock(m) {
                libc::EBUSY => Look::Held,
                0 => {
                    libc::pthread_mutex_unlock(m);
                    Look::Free
                }
                libc::EOWNERDEAD => {
                    libc::pthread_mutex_consistent(m);
                    libc::pthread_mutex_unlock(m);
                    Look::Dead
                }
                _ => Look::Dead, // ENOTRECOVERABLE: someone let go of it inconsistent
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = slot;
        Look::Free
    }
}

#[cfg(target_os = "linux")]
fn check(rc: libc::c_int) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(rc))
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// A shared anonymous mapping of `n` slots that forked children share.
    fn slots(n: usize) -> *mut u8 {
        // SAFETY: a fresh anonymous shared mapping; never unmapped (a test's lifetime).
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                n * SLOT_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        p.cast()
    }

    /// Forks a child that holds the lifeline at `slot`, says so through a pipe, then waits
    /// (stopped by a signal, or until killed). Returns its pid once it holds it.
    fn child_holding(slot: *mut u8) -> libc::pid_t {
        let mut fds = [0; 2];
        // SAFETY: plain syscalls; the child only calls async-signal-safe functions
        // (trylock of an uncontended robust mutex, write, pause, _exit).
        unsafe {
            assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
            let pid = libc::fork();
            assert!(pid >= 0);
            if pid == 0 {
                let ok = matches!(hold(slot), Ok(true));
                libc::write(fds[1], [u8::from(ok)].as_ptr().cast(), 1);
                loop {
                    libc::pause();
                }
            }
            libc::close(fds[1]);
            let mut b = [0u8; 1];
            assert_eq!(libc::read(fds[0], b.as_mut_ptr().cast(), 1), 1);
            libc::close(fds[0]);
            assert_eq!(b[0], 1, "the child could not take its lifeline");
            pid
        }
    }

    fn reap(pid: libc::pid_t) {
        let mut status = 0;
        // SAFETY: waits for our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    }

    #[test]
    fn a_lifeline_says_held_while_its_holder_lives_or_is_stopped_and_dead_once_it_is_killed() {
        let s = slots(1);
        // SAFETY: `s` is a mapped, 8-aligned slot nobody else uses yet.
        unsafe { init(s).unwrap() };
        // SAFETY: as above, for every look below.
        assert_eq!(unsafe { look(s) }, Look::Free);
        assert_eq!(
            unsafe { look(s) },
            Look::Free,
            "a look lets go of a free lifeline"
        );
        let pid = child_holding(s);
        assert_eq!(unsafe { look(s) }, Look::Held);
        // SAFETY: signals to our own child.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
        assert_eq!(unsafe { look(s) }, Look::Held, "a stopped process is alive");
        unsafe { libc::kill(pid, libc::SIGKILL) };
        reap(pid);
        assert_eq!(unsafe { look(s) }, Look::Dead);
        assert_eq!(
            unsafe { look(s) },
            Look::Free,
            "the look that saw it dead freed it"
        );
        assert_eq!(unsafe { look(s) }, Look::Free);
    }

    #[test]
    fn a_lifeline_is_marked_before_its_holder_is_reaped_and_one_died_can_be_held_again() {
        let s = slots(2);
        let t = s.wrapping_add(SLOT_BYTES);
        // SAFETY: two mapped, 8-aligned slots of our own.
        unsafe {
            init(s).unwrap();
            init(t).unwrap();
        }
        let a = child_holding(s);
        let b = child_holding(t);
        // SAFETY: signals to our own children; looks at our slots.
        unsafe { libc::kill(a, libc::SIGKILL) };
        // A zombie (dead, not reaped) is dead: poll until the kernel marked it, bounded.
        let mut seen = Look::Held;
        for _ in 0..60_000 {
            seen = unsafe { look(s) };
            if seen != Look::Held {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(seen, Look::Dead);
        assert_eq!(unsafe { look(t) }, Look::Held, "the other holder lives");
        reap(a);
        // A replacement takes a lifeline whose holder died (no look in between: a look
        // leaves a dead one not recoverable), and it is held again.
        unsafe { libc::kill(b, libc::SIGKILL) };
        reap(b);
        let c = child_holding(t);
        assert_eq!(unsafe { look(t) }, Look::Held);
        unsafe { libc::kill(c, libc::SIGKILL) };
        reap(c);
        assert_eq!(unsafe { look(t) }, Look::Dead);
    }
}
