//! Process identity and liveness that the kernel vouches for.
//!
//! Every process that uses the core holds an exclusive `flock` on a token file of its own,
//! `/dev/shm/ec.<pid>-<nonce>.live`. The kernel drops that lock the instant the process dies
//! (its files are closed before it becomes a zombie), so any other process, in any PID
//! namespace that shares `/dev/shm`, tells a live owner from a dead one by trying to take a
//! *shared* lock on the token without blocking: it fails while the owner lives, succeeds once
//! it is gone. So:
//! * a zombie (dead, not yet reaped) is dead; a stopped process (SIGSTOP, a debugger) is alive;
//! * a reused pid is a new process: its nonce, and so its token, differ;
//! * a process in another PID namespace with the same pid has another nonce;
//! * nothing is ever judged by `kill(pid, 0)`.
//!
//! An [`Identity`] is `(pid, nonce)`; it packs into one `u64` (never 0) so that shared-memory
//! structures can store it in a single atomic word, and it names the token and every segment
//! the process owns (`ec.<pid>-<nonce>.…`), which is how [`crate::shm::sweep_stale`] finds
//! what a dead owner left.
//!
//! Life cycle of a token:
//! * made on first use: created under a `.tmp` name, locked, then renamed to `.live`, so a
//!   `.live` token is always locked while its owner lives (a sweeper that sees an unlocked
//!   `.tmp` removes it and the owner retries with a new nonce);
//! * its descriptor is close-on-exec, and a forked child closes its inherited copy at once
//!   (`pthread_atfork`) and makes a token of its own on first use: the parent's lock is never
//!   held by a child;
//! * removed at normal exit (`atexit`); after a crash the next sweep removes it.
//!
//! Caveat: a process that closes every descriptor it has (some daemonizing code does) drops
//! its token and would look dead; easycore re-checks its own token before it publishes its
//! identity into a new structure.

use crate::error::{CoreError, Result};
use crate::wait::current_pid;
use std::ffi::CString;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::Once;

/// Where tokens (and shared-memory segments) live.
pub const SHM_DIR: &str = "/dev/shm";

/// A process: its pid (in its own namespace) and a random nonce (never 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Identity {
    pub pid: u32,
    pub nonce: u32,
}

impl Identity {
    /// One word for shared memory: `pid << 32 | nonce` (never 0, since the nonce is not).
    pub fn packed(self) -> u64 {
        (u64::from(self.pid) << 32) | u64::from(self.nonce)
    }

    /// The identity stored by [`Identity::packed`]; `None` for 0 (no identity).
    pub fn unpack(w: u64) -> Option<Identity> {
        let nonce = w as u32;
        (nonce != 0).then_some(Identity {
            pid: (w >> 32) as u32,
            nonce,
        })
    }

    /// `<pid>-<nonce>`: the owner part of every name this process owns.
    pub fn tag(self) -> String {
        format!("{}-{:08x}", self.pid, self.nonce)
    }

    /// Parses a [`Identity::tag`].
    pub fn from_tag(tag: &str) -> Option<Identity> {
        let (pid, nonce) = tag.split_once('-')?;
        if nonce.len() != 8 {
            return None;
        }
        let id = Identity {
            pid: pid.parse().ok()?,
            nonce: u32::from_str_radix(nonce, 16).ok()?,
        };
        (id.nonce != 0).then_some(id)
    }

    fn token_path(self, suffix: &str) -> String {
        format!(
            "{SHM_DIR}/{}{}.{suffix}",
            crate::shm::NAME_PREFIX,
            self.tag()
        )
    }
}

/// This process's identity (packed), 0 until made.
static ME: AtomicU64 = AtomicU64::new(0);
/// The pid that made [`ME`]; a forked child sees a different pid and makes its own.
static ME_PID: AtomicU32 = AtomicU32::new(0);
/// The token's descriptor (-1: none).
static TOKEN_FD: AtomicI32 = AtomicI32::new(-1);
/// pid of the thread's process that is making the token now (0: nobody); a spin flag rather
/// than a mutex, so that a fork in the middle cannot leave it locked in the child.
static MAKING: AtomicU32 = AtomicU32::new(0);
static HOOKS: Once = Once::new();

extern "C" fn forget_in_child() {
    // A forked child must not keep the parent's lock alive: close its copy of the descriptor
    // (the lock belongs to the open file description, which the parent still holds).
    let fd = TOKEN_FD.swap(-1, Ordering::Relaxed);
    if fd >= 0 {
        // SAFETY: close is async-signal-safe; the descriptor is this process's copy.
        unsafe { libc::close(fd) };
    }
    ME.store(0, Ordering::Relaxed);
    ME_PID.store(0, Ordering::Relaxed);
    MAKING.store(0, Ordering::Relaxed);
}

extern "C" fn remove_token_at_exit() {
    // Only the process that made the token removes it (a forked child has ME_PID 0).
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as u32;
    if ME_PID.load(Ordering::Relaxed) != pid {
        return;
    }
    if let Some(id) = Identity::unpack(ME.load(Ordering::Relaxed)) {
        if let Ok(p) = CString::new(id.token_path("live")) {
            // SAFETY: valid C string.
            unsafe { libc::unlink(p.as_ptr()) };
        }
    }
}

fn random_u32() -> u32 {
    let mut v = 0u32;
    // SAFETY: getrandom writes at most 4 bytes into `v`.
    let n = unsafe { libc::getrandom((&mut v as *mut u32).cast(), 4, libc::GRND_NONBLOCK) };
    if n != 4 {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        v = ((t ^ (t >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as u32;
    }
    v
}

fn open_c(path: &str, flags: libc::c_int, mode: libc::mode_t) -> std::io::Result<libc::c_int> {
    let c = CString::new(path).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: valid C string; the descriptor is returned to the caller, who closes it.
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC, mode as libc::c_uint) };
    if fd < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(fd)
    }
}

/// Makes a token: `.tmp`, locked, then renamed to `.live`.
fn make_token(pid: u32) -> Result<(Identity, libc::c_int)> {
    for _ in 0..64 {
        let id = Identity {
            pid,
            nonce: random_u32().max(1),
        };
        let tmp = id.token_path("tmp");
        let fd = match open_c(&tmp, libc::O_CREAT | libc::O_EXCL | libc::O_RDWR, 0o644) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => continue,
            Err(e) => {
                return Err(CoreError::Io {
                    context: format!("creating the liveness token {tmp}"),
                    source: e,
                })
            }
        };
        // SAFETY: fd is ours.
        let locked = unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) } == 0;
        let live = id.token_path("live");
        let (ct, cl) = (CString::new(tmp).unwrap(), CString::new(live).unwrap());
        // SAFETY: valid C strings.
        if locked && unsafe { libc::rename(ct.as_ptr(), cl.as_ptr()) } == 0 {
            return Ok((id, fd));
        }
        // A sweeper took our unlocked .tmp for a dead one's: start again with a new nonce.
        // SAFETY: fd is ours; the path is ours (or already gone).
        unsafe {
            libc::close(fd);
            libc::unlink(ct.as_ptr());
        }
    }
    Err(CoreError::Invalid(
        "could not create a liveness token in /dev/shm".into(),
    ))
}

/// This process's identity, making its token on first use (and again in a forked child).
pub fn me() -> Result<Identity> {
    let pid = current_pid();
    if ME_PID.load(Ordering::Acquire) == pid {
        if let Some(id) = Identity::unpack(ME.load(Ordering::Acquire)) {
            return Ok(id);
        }
    }
    HOOKS.call_once(|| {
        // SAFETY: both register plain extern "C" functions without captured state; the fork
        // handler only closes a descriptor and stores atomics (async-signal-safe).
        unsafe {
            libc::pthread_atfork(None, None, Some(forget_in_child));
            libc::atexit(remove_token_at_exit);
        }
    });
    loop {
        match MAKING.compare_exchange(0, pid, Ordering::Acquire, Ordering::Relaxed) {
            Ok(_) => break,
            Err(_) => {
                if ME_PID.load(Ordering::Acquire) == pid {
                    if let Some(id) = Identity::unpack(ME.load(Ordering::Acquire)) {
                        return Ok(id);
                    }
                }
                std::thread::yield_now();
            }
        }
    }
    let made = if ME_PID.load(Ordering::Acquire) == pid {
        Identity::unpack(ME.load(Ordering::Acquire)).map(|id| (id, -1))
    } else {
        None
    };
    let out = match made {
        Some((id, _)) => Ok(id),
        None => make_token(pid).map(|(id, fd)| {
            TOKEN_FD.store(fd, Ordering::Relaxed);
            ME.store(id.packed(), Ordering::Release);
            ME_PID.store(pid, Ordering::Release);
            id
        }),
    };
    MAKING.store(0, Ordering::Release);
    out
}

/// Whether `id`'s owner is alive, as far as anyone can tell: dead only when its token is gone
/// or unlocked. Errors other than "no such file" count as alive (never judge dead what cannot
/// be vouched for).
pub fn alive(id: Identity) -> bool {
    if Identity::unpack(ME.load(Ordering::Acquire)) == Some(id)
        && ME_PID.load(Ordering::Acquire) == current_pid()
    {
        return true;
    }
    probe_path(&id.token_path("live"))
}

/// Whether the token file at `path` is held (or cannot be judged).
fn probe_path(path: &str) -> bool {
    let fd = match open_c(path, libc::O_RDONLY, 0) {
        Ok(fd) => fd,
        Err(e) => return e.raw_os_error() != Some(libc::ENOENT),
    };
    // SAFETY: fd is ours; a shared non-blocking lock is taken and dropped with the close.
    let r = unsafe { libc::flock(fd, libc::LOCK_SH | libc::LOCK_NB) };
    let err = std::io::Error::last_os_error().raw_os_error();
    // SAFETY: fd is ours.
    unsafe { libc::close(fd) };
    r != 0 && err != Some(libc::EBADF)
}

/// Whether an identity packed in a shared word is alive (0 is nobody: not alive).
pub fn alive_packed(w: u64) -> bool {
    Identity::unpack(w).is_some_and(alive)
}

/// Whether the owner of `tag` is dead, for the sweep: its `.live` token is gone or unlocked,
/// and so is a `.tmp` one (an owner making its token has a locked `.tmp`).
pub fn owner_dead(id: Identity) -> bool {
    !alive(id) && !probe_path(&id.token_path("tmp"))
}

/// Blocks until `id`'s owner dies (its token lock is released), or returns at once if it is
/// dead already. Used by a watchdog thread; no polling: the kernel wakes the `flock`.
pub fn wait_for_death(id: Identity) {
    let fd = match open_c(&id.token_path("live"), libc::O_RDONLY, 0) {
        Ok(fd) => fd,
        Err(_) => return,
    };
    loop {
        // SAFETY: fd is ours; a blocking shared lock returns once no exclusive lock is held.
        let r = unsafe { libc::flock(fd, libc::LOCK_SH) };
        if r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            break;
        }
    }
    // SAFETY: fd is ours.
    unsafe { libc::close(fd) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_packs_and_tags_round_trip() {
        let id = Identity {
            pid: 4_000_123,
            nonce: 0xdead_beef,
        };
        assert_eq!(Identity::unpack(id.packed()), Some(id));
        assert_eq!(Identity::from_tag(&id.tag()), Some(id));
        assert_eq!(Identity::unpack(0), None);
        assert_eq!(Identity::from_tag("12.34"), None);
    }

    #[test]
    fn me_is_alive_and_a_made_up_identity_is_not() {
        let id = me().unwrap();
        assert_eq!(me().unwrap(), id);
        assert!(alive(id));
        assert!(probe_path(&id.token_path("live")));
        let ghost = Identity {
            pid: id.pid,
            nonce: id.nonce ^ 0x5a5a_5a5a,
        };
        assert!(!alive(ghost));
        assert!(owner_dead(ghost));
    }

    #[test]
    fn a_forked_child_has_its_own_identity_and_a_zombie_is_dead() {
        let parent = me().unwrap();
        let mut fds = [0; 2];
        // SAFETY: pipe fills two descriptors.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let (rd, wr) = (fds[0], fds[1]);
        // SAFETY: the child only calls me(), writes 8 bytes and _exits.
        let child = unsafe { libc::fork() };
        if child == 0 {
            let w = me().map(|id| id.packed()).unwrap_or(0);
            // SAFETY: writes 8 bytes from a local; _exit skips destructors (fork child).
            unsafe {
                libc::write(wr, (&w as *const u64).cast(), 8);
                libc::_exit(0);
            }
        }
        let mut w = 0u64;
        // SAFETY: reads 8 bytes into a local.
        assert_eq!(unsafe { libc::read(rd, (&mut w as *mut u64).cast(), 8) }, 8);
        let kid = Identity::unpack(w).expect("child made an identity");
        assert_ne!(kid, parent);
        // The child exits and stays a zombie until we reap it: it must read as dead.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waits for our child's exit without reaping it (WNOWAIT).
        let r = unsafe {
            libc::waitid(
                libc::P_PID,
                child as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        assert_eq!(r, 0);
        assert!(!alive(kid), "a zombie must read as dead");
        assert!(alive(parent));
        let mut status = 0;
        // SAFETY: reaps our own child; closes our pipe ends.
        unsafe {
            libc::waitpid(child, &mut status, 0);
            libc::close(rd);
            libc::close(wr);
        }
        // The child _exited without removing its token: the sweep may remove it.
        assert!(owner_dead(kid));
    }
}
