//! Queues this process left without finding itself the last party, retried later.
//!
//! The last process to leave a queue removes its names: it takes the queue's token
//! exclusively ([`LastHold`]) and, holding it, removes the segments and then the token. A hold
//! is a *shared* `flock`, and a `flock` belongs to an open file description: every descriptor
//! for it shares the lock, the copies in a child included. A child that this process is
//! forking at that moment, in another thread, holds such copies: between `fork` (or `vfork`)
//! and `exec` (`subprocess`, a `spawn` start, the resource tracker), or until it lets go of
//! what it inherited (a `fork`-started producer, the zygote). A leave in that window finds
//! the token held by its own copy and leaves the names to "the last party"; the child then
//! drops its copy with the `exec` (close-on-exec) without looking, and nobody removes them
//! until the next sweep. Measured: 293 of 3,000 queues created and dropped beside a thread
//! running `subprocess.run` in a loop kept their token.
//!
//! So a leave that did not find itself last, while the token is still there, is noted here
//! ([`note`]) and retried ([`retry`]) at this process's next queue creation, attach or drop,
//! and at its normal exit. A retry removes the queue's names once nobody holds the token (the
//! copy is gone), forgets the note once the token is gone (another party removed it), and
//! keeps it otherwise (the queue has a live party: it removes the names when it leaves).
//!
//! Death or stall between two steps changes nothing: a retry holds the token exclusively
//! while it removes anything, exactly as a last party does, and a process that dies with
//! notes leaves those queues to their other parties or to the next sweep, as before. The
//! notes are fixed atomics, not a mutex (a fork may land anywhere; a forked child that
//! retries its parent's notes removes only names nobody holds). At most [`SLOTS`] notes; a
//! leave beyond them is left to the sweep.

use crate::liveness::{LastHold, QueueTag};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Most queues noted at once.
pub const SLOTS: usize = 64;

/// Invariant: each word is 0 (free) or the tag of a queue this process left while its token
/// was held by another descriptor; a retry claims a note by swapping it to 0 first, so one
/// thread at a time works on it (a tag may be noted twice: both retries are harmless).
static NOTES: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];

/// Whether the exit hook is registered.
static AT_EXIT: AtomicBool = AtomicBool::new(false);

/// Notes that this process left `tag`'s queue and was not its last party (the token was held).
pub fn note(tag: QueueTag) {
    if tag.0 == 0 {
        return; // 0 marks a free word (a random tag of 0 is left to the sweep)
    }
    if !AT_EXIT.swap(true, Ordering::AcqRel) {
        // SAFETY: registers a plain extern "C" function without captured state.
        unsafe { libc::atexit(retry_at_exit) };
    }
    for n in &NOTES {
        if n.compare_exchange(0, tag.0, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            return;
        }
    }
}

/// Leaves `tag`'s queue for good if nobody holds its token any more: removes its names.
/// Returns how many queues' names were removed.
pub fn retry() -> usize {
    let mut removed = 0;
    for n in &NOTES {
        let t = n.load(Ordering::Acquire);
        if t == 0
            || n.compare_exchange(t, 0, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            continue;
        }
        let tag = QueueTag(t);
        match LastHold::take(tag) {
            Some(hold) => {
                crate::sweep::unlink_queue_names(tag);
                drop(hold); // removes the token, last
                removed += 1;
            }
            None if crate::sweep::is_ours(&tag.token_path()) => note(tag), // still held
            None => {} // gone: its last party removed it
        }
    }
    removed
}

/// Whether a queue is noted.
#[cfg(test)]
pub(crate) fn noted(tag: QueueTag) -> bool {
    NOTES.iter().any(|n| n.load(Ordering::Acquire) == tag.0)
}

extern "C" fn retry_at_exit() {
    retry();
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::liveness::{me, QueueToken};
    use std::os::fd::{FromRawFd, OwnedFd};

    pub(crate) fn token_exists(tag: QueueTag) -> bool {
        std::path::Path::new(&tag.token_path()).exists()
    }

    /// Retries until `tag`'s token is gone (other tests' queues retry the same notes from
    /// their threads: one of them may hold the note for a moment). Bounded.
    pub(crate) fn retried_until_gone(tag: QueueTag) -> bool {
        for _ in 0..10_000 {
            retry();
            if !token_exists(tag) {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        false
    }

    #[test]
    fn a_leave_while_a_copy_holds_the_token_is_finished_by_a_retry() {
        let token = QueueToken::create(me().unwrap()).unwrap();
        let tag = token.tag();
        // A copy of the hold's descriptor, as a child being forked has until it execs.
        // SAFETY: dup of a descriptor the token owns; the copy is owned by `copy` below.
        let copy = unsafe { OwnedFd::from_raw_fd(libc::dup(token.raw_fd())) };
        assert!(token.leave().is_none(), "the copy holds the shared lock");
        note(tag);
        retry();
        assert!(token_exists(tag), "removed while a copy still held it");
        drop(copy); // the child execs
        assert!(
            retried_until_gone(tag),
            "the retry did not remove the token"
        );
        retry();
        assert!(!noted(tag));
    }

    #[test]
    fn a_note_whose_token_another_party_removed_is_forgotten() {
        let token = QueueToken::create(me().unwrap()).unwrap();
        let tag = token.tag();
        note(tag);
        drop(token.leave()); // the last party removes it
        assert!(!token_exists(tag));
        retry();
        assert!(!noted(tag));
    }
}
