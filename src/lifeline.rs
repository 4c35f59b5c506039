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
    //! Holders are threads here: the kernel walks a thread's robust list when the thread
    //! ends, as when its process does. (Forked holders would keep the flocks of tokens that
    //! tests running beside them hold, through inherited descriptors, for as long as they
    //! live; the Python tests kill and stop holder processes.)
    use super::*;
    use std::sync::mpsc;
    use std::thread;

    /// `n` slots of shared anonymous memory (the kind other processes would share).
    fn slots(n: usize) -> usize {
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
        p as usize
    }

    /// A thread that holds the lifeline at `slot` (whether it could is sent back first) and
    /// ends when `end` is dropped.
    fn holder(slot: usize) -> (thread::JoinHandle<()>, mpsc::Sender<()>, bool) {
        let (took_tx, took_rx) = mpsc::channel();
        let (end_tx, end_rx) = mpsc::channel::<()>();
        let t = thread::spawn(move || {
            // SAFETY: the slot was made by `init` and stays mapped.
            let took = unsafe { hold(slot as *mut u8) }.unwrap();
            took_tx.send(took).unwrap();
            let _ = end_rx.recv(); // until the sender is dropped
        });
        let took = took_rx.recv().unwrap();
        (t, end_tx, took)
    }

    #[test]
    fn a_lifeline_says_held_while_its_holder_lives_and_dead_once_it_ends() {
        let s = slots(1);
        let p = s as *mut u8;
        // SAFETY: `p` is a mapped, 8-aligned slot of our own, for every call below.
        unsafe { init(p).unwrap() };
        assert_eq!(unsafe { look(p) }, Look::Free);
        assert_eq!(
            unsafe { look(p) },
            Look::Free,
            "a look lets go of a free lifeline"
        );
        let (t, end, took) = holder(s);
        assert!(took);
        assert_eq!(unsafe { look(p) }, Look::Held);
        assert_eq!(unsafe { look(p) }, Look::Held);
        let (t2, end2, took2) = holder(s);
        assert!(!took2, "a lifeline held by a live thread is not taken");
        drop(end2);
        t2.join().unwrap();
        assert_eq!(
            unsafe { look(p) },
            Look::Held,
            "one that could not take it lets go of nothing"
        );
        drop(end);
        t.join().unwrap();
        assert_eq!(unsafe { look(p) }, Look::Dead);
        assert_eq!(
            unsafe { look(p) },
            Look::Free,
            "the look that saw it dead freed it"
        );
        assert_eq!(unsafe { look(p) }, Look::Free);
    }

    #[test]
    fn a_lifeline_whose_holder_died_is_taken_by_its_successor_and_held_again() {
        let s = slots(2);
        let (p, q) = (s as *mut u8, (s + SLOT_BYTES) as *mut u8);
        // SAFETY: two mapped, 8-aligned slots of our own, for every call below.
        unsafe {
            init(p).unwrap();
            init(q).unwrap();
        }
        let (a, end_a, _) = holder(s);
        let (b, end_b, _) = holder(s + SLOT_BYTES);
        drop(end_a);
        a.join().unwrap();
        // No look in between: the successor finds "owner died" and takes it.
        let (c, end_c, took) = holder(s);
        assert!(took);
        assert_eq!(unsafe { look(p) }, Look::Held);
        assert_eq!(unsafe { look(q) }, Look::Held, "the other holder lives");
        drop(end_c);
        c.join().unwrap();
        assert_eq!(unsafe { look(p) }, Look::Dead);
        drop(end_b);
        b.join().unwrap();
        assert_eq!(unsafe { look(q) }, Look::Dead);
    }
}
