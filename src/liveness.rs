//! Process identity and liveness that the kernel vouches for, and that another user can
//! neither forge nor break.
//!
//! Every process that uses the core holds an exclusive `flock` on a token file of its own,
//! `/dev/shm/ec.<pid>-<nonce>.live` (mode 0600, so no other uid can open it, let alone lock
//! it). The kernel drops that lock the instant the process dies (its files are closed before
//! it becomes a zombie), so any other process of ours, in any PID namespace that shares
//! `/dev/shm`, tells a live owner from a dead one by trying to take a *shared* lock on the
//! token without blocking: it fails while the owner lives, succeeds once it is gone. So:
//! * a zombie (dead, not yet reaped) is dead; a stopped process (SIGSTOP, a debugger) is alive;
//! * a reused pid is a new process: its nonce, and so its token, differ;
//! * a process in another PID namespace with the same pid has another nonce;
//! * nothing is ever judged by `kill(pid, 0)`.
//!
//! Probes trust nothing they find under a token's name ([`crate::trust::open_own`]): no link is
//! followed, a FIFO never blocks, and anything that is not a 0600 regular file of our uid is
//! not a token. **A missing or broken token alone is never proof of death**: then the second
//! witness decides, `/proc/<pid>/stat` ([`pid_witness`]): a process with that pid that is not a
//! zombie counts as alive (it may be the owner whose token someone removed: RemoveIPC at
//! logout, a hand, a planted file after a clean exit); no such process, or a zombie, is dead.
//! An *unlocked genuine* token is the kernel's word: its owner is dead.
//!
//! An [`Identity`] is `(pid, nonce)`; it packs into one `u64` (never 0) so that shared-memory
//! structures can store it in a single atomic word, and it names the token and the segments
//! the process owns (`ec.<pid>-<nonce>.…`), which is how [`crate::sweep::sweep_stale`] finds
//! what a dead owner left. A queue's names are tagged by the queue instead ([`QueueToken`]).
//!
//! Life cycle of a token:
//! * made on first use: created under its final name (`O_CREAT | O_EXCL`, 0600), locked, then
//!   checked to be still named. A sweeper that finds a token unlocked removes it *while
//!   holding its lock*, so by the time the maker's lock is granted, any such removal has
//!   happened, and the maker, seeing its file unnamed, starts again with a new nonce: a live
//!   process is never left without a token (this replaces a create-then-rename scheme whose
//!   window let a sweep judge a live process dead);
//! * its descriptor is close-on-exec, recorded before any fork can copy it
//!   ([`crate::trust::unsplit`]), and a forked child closes its inherited copy at once
//!   (`pthread_atfork`) and makes a token of its own on first use: the parent's lock is never
//!   held by a child;
//! * removed at normal exit (`atexit`) or by [`retire`]; since a missing token is not proof of
//!   death, daemon threads that still run queue code after that are not judged dead while the
//!   process lives; after a crash, whoever learns of the death ([`bury`]: a repairer, a parent
//!   that reaps, a watchdog) or else the next sweep removes it.
//!
//! Queue tokens (`ec.q<tag>.live`, [`QueueToken`]) work the other way round: every process
//! using the queue holds a *shared* lock, and "nobody holds it" (an exclusive lock granted at
//! once, [`LastHold`]) means the queue's names may go. Each process lists the queue tokens it
//! holds, so a watchdog about to `_exit` can let go of them ([`release_queue_holds`]).
//!
//! Caveats (see `docs/safety.md`): a process that closes every descriptor it has drops its
//! token's lock and would look dead; a token removed by hand whose pid is then reused keeps
//! the dead owner "alive" until that pid exits (waits end in clear errors meanwhile); the pid
//! witness means nothing for an owner in another PID namespace.

use crate::error::{CoreError, Result};
use crate::trust::{self, Opened};
use crate::wait::current_pid;
use std::ffi::CString;
use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// Where tokens (and shared-memory segments) live.
pub const SHM_DIR: &str = "/dev/shm";

/// Prefix of every name this library creates there: segments (`/ec.…`, see
/// [`crate::shm`]) and tokens (`ec.<tag>.live`).
pub const NAME_PREFIX: &str = "ec.";

/// The path of the token file of `tag` (an [`Identity`]'s or a [`QueueTag`]'s).
fn token_path_of(tag: &str) -> String {
    format!("{SHM_DIR}/{NAME_PREFIX}{tag}.live")
}

/// How long a maker waits for a token's lock that a same-user prober holds for an instant.
const LOCK_WAIT: Duration = Duration::from_millis(200);

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
        if nonce.len() != 8 || pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let id = Identity {
            pid: pid.parse().ok()?,
            nonce: u32::from_str_radix(nonce, 16).ok()?,
        };
        (id.nonce != 0).then_some(id)
    }

    fn token_path(self) -> String {
        token_path_of(&self.tag())
    }
}

/// This process's identity (packed), 0 until made.
static ME: AtomicU64 = AtomicU64::new(0);
/// The pid that made [`ME`]; a forked child sees a different pid and makes its own.
static ME_PID: AtomicU32 = AtomicU32::new(0);
/// The token's descriptor (-1: none). Set inside the same [`trust::unsplit`] section as the
/// `open` that made it, so a forked child always knows (and closes) the copy it inherits.
static TOKEN_FD: AtomicI32 = AtomicI32::new(-1);
/// pid of the thread's process that is making the token now (0: nobody); a spin flag rather
/// than a mutex, so that a fork in the middle cannot leave it locked in the child.
static MAKING: AtomicU32 = AtomicU32::new(0);
/// Whether the fork and exit hooks are registered. A flag, not a `Once`: a fork while another
/// thread is inside a `Once` leaves it "running" for ever in the child.
static HOOKS: AtomicBool = AtomicBool::new(false);

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

/// Removes this process's token now. For a process about to die by a signal (atexit
/// handlers will not run). Others go on reading it as alive while its pid lives (a missing
/// token is not proof of death), and as dead once it is gone.
pub fn retire() {
    remove_token_at_exit();
}

extern "C" fn remove_token_at_exit() {
    // Only the process that made the token removes it (a forked child has ME_PID 0). The lock
    // stays held (the descriptor stays open) until the process is gone.
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as u32;
    if ME_PID.load(Ordering::Relaxed) != pid {
        return;
    }
    if let Some(id) = Identity::unpack(ME.load(Ordering::Relaxed)) {
        if let Ok(p) = CString::new(id.token_path()) {
            // SAFETY: valid C string.
            unsafe { libc::unlink(p.as_ptr()) };
        }
    }
}

/// Makes a token (see the module's documentation): created 0600 under its final name,
/// locked, then checked to be still named.
fn make_token(pid: u32) -> Result<Identity> {
    for _ in 0..64 {
        let nonce = (trust::random_u64().map_err(|e| CoreError::Io {
            context: "getrandom for a liveness token".into(),
            source: e,
        })? as u32)
            .max(1);
        let id = Identity { pid, nonce };
        let path = trust::c_path(&id.token_path()).expect("no NUL in a token path");
        let made = trust::unsplit(|| {
            trust::create_own(&path).map(|fd| {
                let fd = fd.into_raw_fd();
                TOKEN_FD.store(fd, Ordering::SeqCst);
                fd
            })
        });
        let fd = match made {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => continue,
            Err(e) => {
                return Err(CoreError::Io {
                    context: format!("creating the liveness token {}", id.token_path()),
                    source: e,
                })
            }
        };
        // A prober of ours may hold a shared lock for an instant; a sweeper that judged the
        // fresh, unlocked token dead holds an exclusive one while it removes the name.
        if trust::flock_within(fd, libc::LOCK_EX, LOCK_WAIT) && trust::still_named(fd, &path) {
            return Ok(id);
        }
        // Swept (or never locked): start again with a new nonce. Only our own file is
        // removed: the path may now name another user's file, which we must not touch
        // (and cannot, in a sticky folder).
        let still = trust::still_named(fd, &path);
        TOKEN_FD.store(-1, Ordering::SeqCst);
        // SAFETY: fd is ours; path is a valid C string naming our file when `still`.
        unsafe {
            if still {
                libc::unlink(path.as_ptr());
            }
            libc::close(fd);
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
    if !HOOKS.swap(true, Ordering::AcqRel) {
        // SAFETY: both register plain extern "C" functions without captured state; the fork
        // handler only closes a descriptor and stores atomics (async-signal-safe).
        unsafe {
            libc::pthread_atfork(None, None, Some(forget_in_child));
            libc::atexit(remove_token_at_exit);
        }
    }
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
        Identity::unpack(ME.load(Ordering::Acquire))
    } else {
        None
    };
    let out = match made {
        Some(id) => Ok(id),
        None => make_token(pid).inspect(|id| {
            ME.store(id.packed(), Ordering::Release);
            ME_PID.store(pid, Ordering::Release);
        }),
    };
    MAKING.store(0, Ordering::Release);
    out
}

/// What a probe of a token found.
#[derive(Debug, PartialEq, Eq)]
enum Token {
    /// A genuine token whose lock is held: its owner lives.
    Held,
    /// A genuine token nobody holds: its owner is dead (the kernel's word).
    Free,
    /// No token, or something under its name that we did not make: no verdict.
    Unknown,
}

/// Probes the token at `path` without blocking and without trusting what is there.
fn probe(path: &str) -> Token {
    let Ok(c) = trust::c_path(path) else {
        return Token::Unknown;
    };
    match trust::open_own(&c, libc::O_RDONLY) {
        Opened::Ours(fd, _) => {
            // SAFETY: fd is ours; the shared non-blocking lock is dropped with the close.
            let r = unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) };
            if r == 0 {
                Token::Free
            } else {
                Token::Held
            }
        }
        _ => Token::Unknown,
    }
}

/// The second witness, when a token is missing or broken: whether a process with `id`'s pid
/// exists in our PID namespace and is not a zombie (`/proc/<pid>/stat`). Our own pid with a
/// nonce that is not ours is an earlier process (dead). Without `/proc`, alive (no verdict).
pub fn pid_witness(id: Identity) -> bool {
    if id.pid == 0 || id.pid > i32::MAX as u32 {
        return false;
    }
    if id.pid == current_pid() {
        return false; // we are alive and `id` is not us (callers check that first)
    }
    match std::fs::read(format!("/proc/{}/stat", id.pid)) {
        Ok(stat) => {
            // `pid (comm) S ...`: the state follows the last ')' (comm may hold anything).
            let state = stat
                .iter()
                .rposition(|&b| b == b')')
                .and_then(|i| stat.get(i + 2).copied());
            !matches!(state, Some(b'Z') | Some(b'X') | Some(b'x'))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // No such process, unless /proc is not mounted here at all.
            !std::path::Path::new("/proc/self/stat").exists()
        }
        Err(_) => true,
    }
}

/// Whether `id`'s owner is alive, as far as anyone can tell: dead when its genuine token is
/// unlocked, or when its token is missing or broken and no live process has its pid.
pub fn alive(id: Identity) -> bool {
    if Identity::unpack(ME.load(Ordering::Acquire)) == Some(id)
        && ME_PID.load(Ordering::Acquire) == current_pid()
    {
        return true;
    }
    match probe(&id.token_path()) {
        Token::Held => true,
        Token::Free => false,
        Token::Unknown => pid_witness(id),
    }
}

/// Whether an identity packed in a shared word is alive (0 is nobody: not alive).
pub fn alive_packed(w: u64) -> bool {
    Identity::unpack(w).is_some_and(alive)
}

/// Whether the owner of `id` is dead, for the sweep.
pub fn owner_dead(id: Identity) -> bool {
    !alive(id)
}

/// Removes `id`'s token if it is a genuine token nobody holds, holding its lock while the
/// name goes (so that a token being made is never removed behind its maker's back: see the
/// module's documentation). Returns whether a token was removed. For whoever learns of a
/// death: tokens of the dead must not pile up.
pub fn bury(id: Identity) -> bool {
    let Ok(c) = trust::c_path(&id.token_path()) else {
        return false;
    };
    bury_at(&c, Duration::ZERO)
}

/// [`bury`] for an owner whose death this process has just seen (a watchdog): every process
/// that watched it learns of the death at the same moment and probes or buries the same
/// token, each holding its lock for a few system calls, so a single try can find it held by
/// another of them, and each of them then leave the token behind. The lock is asked for again
/// for up to `LOCK_WAIT`.
pub fn bury_dead(id: Identity) -> bool {
    let Ok(c) = trust::c_path(&id.token_path()) else {
        return false;
    };
    bury_at(&c, LOCK_WAIT)
}

/// [`bury`] by path, asking for the token's lock for up to `wait`.
pub(crate) fn bury_at(c: &std::ffi::CStr, wait: Duration) -> bool {
    let Opened::Ours(fd, _) = trust::open_own(c, libc::O_RDONLY) else {
        return false;
    };
    // The lock is released by the close (drop of `fd`).
    if !trust::flock_within(fd.as_raw_fd(), libc::LOCK_EX, wait) {
        return false;
    }
    // Unlink only the file we hold (a new one under the same name is someone else's).
    // SAFETY: valid C string.
    trust::still_named(fd.as_raw_fd(), c) && unsafe { libc::unlink(c.as_ptr()) } == 0
}

/// Blocks until `id`'s owner dies (its token lock is released), or returns at once if it is
/// dead already. Used by a watchdog thread: the kernel wakes the `flock` (no polling) when the
/// token is genuine; when it is missing or broken, the pid witness is asked every 200 ms.
pub fn wait_for_death(id: Identity) {
    loop {
        let Ok(c) = trust::c_path(&id.token_path()) else {
            return;
        };
        if let Opened::Ours(fd, _) = trust::open_own(&c, libc::O_RDONLY) {
            // Our own 0600 file: only a process of our uid can lock it, so this wait ends
            // when the owner (or a same-user prober, for an instant) lets go.
            loop {
                // SAFETY: fd is ours; a blocking shared lock returns once no exclusive lock
                // is held.
                let r = unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_SH) };
                if r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                    return;
                }
            }
        }
        if !alive(id) {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A queue's tag: 64 random bits. Every name of the queue (its segment, its pooled slots, its
/// one-shot segments, its token) is `ec.q<16 hex digits>.…`, so the names live as long as any
/// process uses the queue, whoever made it, and not longer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QueueTag(pub u64);

impl QueueTag {
    /// `q<16 hex digits>`.
    pub fn tag(self) -> String {
        format!("q{:016x}", self.0)
    }

    /// Parses a [`QueueTag::tag`].
    pub fn from_tag(tag: &str) -> Option<QueueTag> {
        let hex = tag.strip_prefix('q')?;
        if hex.len() != 16 {
            return None;
        }
        u64::from_str_radix(hex, 16).ok().map(QueueTag)
    }

    pub(crate) fn token_path(self) -> String {
        token_path_of(&self.tag())
    }
}

/// Queue tokens this process holds (`fd`, -1: a free entry, -2: an entry being filled) and
/// their tags, so that a process about to end at once ([`release_queue_holds`], before
/// `_exit`) can let go of them and remove the names of queues it was the last to use. Fixed
/// arrays of atomics rather than a mutex: a fork may land anywhere.
const HOLDS: usize = 256;
static HOLD_FDS: [AtomicI32; HOLDS] = [const { AtomicI32::new(-1) }; HOLDS];
static HOLD_TAGS: [AtomicU64; HOLDS] = [const { AtomicU64::new(0) }; HOLDS];

fn note_hold(tag: QueueTag, fd: libc::c_int) {
    for (f, t) in HOLD_FDS.iter().zip(&HOLD_TAGS) {
        if f.compare_exchange(-1, -2, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            t.store(tag.0, Ordering::Relaxed);
            f.store(fd, Ordering::Release);
            return;
        }
    }
    // More than HOLDS queues at once: this one is only left to the sweep if we _exit.
}

fn forget_hold(fd: libc::c_int) {
    for f in &HOLD_FDS {
        if f.compare_exchange(fd, -1, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            return;
        }
    }
}

/// For a process just forked that uses none of its parent's queues (a zygote that only
/// forks producers, which attach by name): lets go of every queue hold it inherited, so that
/// its life does not keep its parent's queues held after their last real party left (their
/// names then stayed until the next sweep). Each descriptor is replaced by `/dev/null` rather
/// than closed: the queue handles that own them (copies in this process's memory) may still
/// be dropped here, and must then close a descriptor of their own, not one reused since.
/// Holds on the queues in `keep` (the process's own, inherited on purpose) stay. Returns how
/// many holds were let go.
pub fn drop_inherited_holds(keep: &[QueueTag]) -> usize {
    // SAFETY: a valid C string; the descriptor is ours and closed below.
    let null = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if null < 0 {
        return 0;
    }
    let mut n = 0;
    for (f, t) in HOLD_FDS.iter().zip(&HOLD_TAGS) {
        let fd = f.load(Ordering::Acquire);
        if fd < 0 || keep.contains(&QueueTag(t.load(Ordering::Relaxed))) {
            continue;
        }
        // SAFETY: `fd` is a live QueueToken's descriptor (registered while it is open); dup2
        // swaps what it refers to atomically and keeps the number the token owns.
        if unsafe { libc::dup2(null, fd) } == fd {
            n += 1;
        }
    }
    // SAFETY: `null` was opened above and is not used after.
    unsafe { libc::close(null) };
    n
}

/// Lets go of every queue hold of this process and returns the queues' tags: for a process
/// that is ending (a watchdog before `_exit`, a producer on its way out). Each descriptor is
/// replaced by `/dev/null` rather than closed, as in [`drop_inherited_holds`]: the queue
/// handles that own them may still be dropped (and close them) before the process ends. The
/// caller then removes the names of the queues nobody holds any more
/// ([`crate::sweep::leave_queues`]).
pub fn release_queue_holds() -> Vec<QueueTag> {
    // SAFETY: a valid C string; the descriptor is ours and closed below.
    let null = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    let mut tags = Vec::new();
    for (f, t) in HOLD_FDS.iter().zip(&HOLD_TAGS) {
        let fd = f.load(Ordering::Acquire);
        if fd >= 0
            && f.compare_exchange(fd, -1, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            tags.push(QueueTag(t.load(Ordering::Relaxed)));
            if null >= 0 {
                // SAFETY: `fd` was registered by a live QueueToken of this process; dup2 swaps
                // what it refers to atomically and keeps the number the token owns.
                unsafe { libc::dup2(null, fd) };
            } else {
                // SAFETY: as above; without /dev/null the descriptor is closed (the ending
                // process's handles are not dropped after: a watchdog's `_exit`).
                unsafe { libc::close(fd) };
            }
        }
    }
    if null >= 0 {
        // SAFETY: `null` was opened above and is not used after.
        unsafe { libc::close(null) };
    }
    tags
}

/// A process's hold on a queue's token, `ec.q<tag>.live`: a *shared* `flock`, held by every
/// process that has a handle on the queue (the creator and everyone who attached, and forked
/// children of theirs, which share the lock through the inherited descriptor). The sweep
/// probes with an *exclusive* non-blocking lock, so the queue's names stay while any party
/// lives, whoever made them, and become sweepable when the last party is gone; a dead
/// creator's pooled messages stay readable until drained.
///
/// Invariant: a holder took its shared lock *before* it opened any of the queue's segments,
/// and the sweeper (or last party) removes the segments and then the token *while holding
/// the exclusive lock*; so a party never finds a segment removed under it, and a party that
/// joins as the queue is being removed finds the token unnamed and fails cleanly.
#[derive(Debug)]
pub struct QueueToken {
    tag: QueueTag,
    /// Held for its shared lock; closing it lets go. Listed in the process's holds while open.
    fd: OwnedFd,
}

impl Drop for QueueToken {
    fn drop(&mut self) {
        forget_hold(self.fd.as_raw_fd()); // then `fd` closes
    }
}

impl QueueToken {
    /// A new queue tag and its token, held shared. The token's content is the creator's tag
    /// (`<pid>-<nonce>`), for diagnostics and leak checks only: nothing trusts it.
    pub fn create(creator: Identity) -> Result<QueueToken> {
        for _ in 0..64 {
            let tag = QueueTag(trust::random_u64().map_err(|e| CoreError::Io {
                context: "getrandom for a queue name".into(),
                source: e,
            })?);
            let path = trust::c_path(&tag.token_path()).expect("no NUL in a token path");
            // Created and registered in one section: a child forked in between would hold an
            // unknown copy of the descriptor, keeping the queue's names alive.
            let made =
                trust::unsplit(|| trust::create_own(&path).map(|fd| QueueToken::held(tag, fd)));
            let token = match made {
                Ok(t) => t,
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => continue,
                Err(e) => {
                    return Err(CoreError::Io {
                        context: format!("creating the queue token {}", tag.token_path()),
                        source: e,
                    })
                }
            };
            let fd = token.fd.as_raw_fd();
            let who = creator.tag();
            // SAFETY: writes `who` (a local string) into our new file; a short write only
            // shortens a diagnostic.
            unsafe { libc::pwrite(fd, who.as_ptr().cast(), who.len(), 0) };
            if trust::flock_within(fd, libc::LOCK_SH, LOCK_WAIT) && trust::still_named(fd, &path) {
                return Ok(token);
            }
            if trust::still_named(fd, &path) {
                // SAFETY: valid C string naming our own file.
                unsafe { libc::unlink(path.as_ptr()) };
            }
        }
        Err(CoreError::Invalid(
            "could not create a queue token in /dev/shm".into(),
        ))
    }

    /// Joins the queue `tag`: takes the shared lock on its token. A queue whose last party
    /// is gone (its token removed, or being removed) is a clear error; so is a token we did
    /// not make.
    pub fn join(tag: QueueTag) -> Result<QueueToken> {
        let path = tag.token_path();
        let c = trust::c_path(&path).expect("no NUL in a token path");
        let gone = || CoreError::Io {
            context: format!(
                "the queue {} is gone (every process that used it has ended)",
                tag.tag()
            ),
            source: std::io::Error::from_raw_os_error(libc::ENOENT),
        };
        let token = trust::unsplit(|| match trust::open_own(&c, libc::O_RDONLY) {
            Opened::Ours(fd, _) => Ok(QueueToken::held(tag, fd)),
            Opened::Missing => Err(gone()),
            Opened::NotOurs(why) => Err(CoreError::BadSegment(format!(
                "{path} is {why}; refusing it (another user may have planted it)"
            ))),
            Opened::Failed(e) => Err(CoreError::Io {
                context: format!("opening the queue token {path}"),
                source: e,
            }),
        })?;
        let fd = token.fd.as_raw_fd();
        if trust::flock_within(fd, libc::LOCK_SH, LOCK_WAIT) && trust::still_named(fd, &c) {
            Ok(token)
        } else {
            Err(gone())
        }
    }

    fn held(tag: QueueTag, fd: OwnedFd) -> QueueToken {
        note_hold(tag, fd.as_raw_fd());
        QueueToken { tag, fd }
    }

    /// The queue's tag.
    pub fn tag(&self) -> QueueTag {
        self.tag
    }

    /// The held descriptor (for tests that copy it, as a forking child does).
    #[cfg(test)]
    pub(crate) fn raw_fd(&self) -> libc::c_int {
        self.fd.as_raw_fd()
    }

    /// Lets go of this hold; if no process holds the token any more, returns the exclusive
    /// hold of the last party, which removes the token when dropped (the caller removes the
    /// queue's other names first). A forked child's copy never reads as the last: the
    /// descriptor it closes shares the lock of its parent's.
    pub fn leave(self) -> Option<LastHold> {
        let tag = self.tag;
        drop(self);
        LastHold::take(tag)
    }
}

/// The exclusive lock on a queue's token that nobody else holds: the queue's names may be
/// removed. Dropping it removes the token (then releases the lock).
#[derive(Debug)]
pub struct LastHold {
    path: CString,
    fd: OwnedFd,
}

impl LastHold {
    /// The exclusive lock on `tag`'s token if nobody holds it (without waiting).
    pub fn take(tag: QueueTag) -> Option<LastHold> {
        let path = trust::c_path(&tag.token_path()).ok()?;
        let Opened::Ours(fd, _) = trust::open_own(&path, libc::O_RDONLY) else {
            return None;
        };
        // SAFETY: fd is ours; a non-blocking exclusive lock.
        if unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return None;
        }
        trust::still_named(fd.as_raw_fd(), &path).then_some(LastHold { path, fd })
    }
}

impl Drop for LastHold {
    fn drop(&mut self) {
        if trust::still_named(self.fd.as_raw_fd(), &self.path) {
            // SAFETY: valid C string naming the file we hold locked.
            unsafe { libc::unlink(self.path.as_ptr()) };
        }
    }
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
        assert_eq!(probe(&id.token_path()), Token::Held);
        let ghost = Identity {
            pid: id.pid,
            nonce: id.nonce ^ 0x5a5a_5a5a,
        };
        assert!(!alive(ghost));
        assert!(owner_dead(ghost));
    }

    #[test]
    fn a_forked_child_has_its_own_identity_and_a_zombie_is_dead() {
        let _forks = crate::testing::forking();
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

    fn shm_mode(path: &str) -> u32 {
        use std::os::unix::fs::MetadataExt;
        std::fs::symlink_metadata(path).unwrap().mode()
    }

    #[test]
    fn tokens_are_0600_and_nobody_else_may_open_them() {
        let id = me().unwrap();
        assert_eq!(shm_mode(&id.token_path()) & 0o777, 0o600);
        let q = QueueToken::create(me().unwrap()).unwrap();
        assert_eq!(shm_mode(&q.tag().token_path()) & 0o777, 0o600);
    }

    #[test]
    fn planted_fifos_links_and_dirs_never_block_and_prove_nothing() {
        let me = me().unwrap();
        // Identities whose tokens are planted things: a dead pid (no such process) and a
        // live one (our parent, the test harness), each with a fresh nonce.
        // SAFETY: getppid has no preconditions.
        let parent = unsafe { libc::getppid() } as u32;
        for (pid, live) in [(i32::MAX as u32 - 11, false), (parent, true)] {
            for plant in ["fifo", "link", "dir", "open"] {
                let id = Identity {
                    pid,
                    nonce: (crate::trust::random_u64().unwrap() as u32).max(1),
                };
                let path = id.token_path();
                let c = crate::trust::c_path(&path).unwrap();
                match plant {
                    // SAFETY: valid C string.
                    "fifo" => assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0),
                    "link" => std::os::unix::fs::symlink(me.token_path(), &path).unwrap(),
                    "dir" => std::fs::create_dir(&path).unwrap(),
                    _ => {
                        std::fs::write(&path, b"").unwrap();
                        use std::os::unix::fs::PermissionsExt;
                        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))
                            .unwrap();
                    }
                }
                assert_eq!(probe(&path), Token::Unknown, "{plant}");
                assert_eq!(alive(id), live, "{plant} for pid {pid}");
                if !live {
                    wait_for_death(id); // returns: never blocks on a planted FIFO
                }
                assert!(!bury(id), "a planted {plant} is never removed as a token");
                if plant == "dir" {
                    std::fs::remove_dir(&path).unwrap();
                } else {
                    std::fs::remove_file(&path).unwrap();
                }
            }
        }
    }

    #[test]
    fn a_live_process_whose_token_was_deleted_is_still_alive() {
        let _forks = crate::testing::forking();
        me().unwrap(); // hooks registered before the fork, not in the child
        crate::trust::unsplit(|| ());
        // SAFETY: the child sleeps until killed.
        let child = unsafe { libc::fork() };
        if child == 0 {
            let _ = me();
            // SAFETY: pause/_exit in a forked child.
            unsafe {
                libc::pause();
                libc::_exit(0);
            }
        }
        let start = std::time::Instant::now();
        let kid_tag = loop {
            // The child's token appears once it made it.
            let found = std::fs::read_dir(SHM_DIR).unwrap().flatten().find_map(|e| {
                let n = e.file_name().into_string().ok()?;
                let tag = n.strip_prefix("ec.")?.strip_suffix(".live")?.to_owned();
                Identity::from_tag(&tag).filter(|id| id.pid == child as u32)
            });
            if let Some(id) = found {
                break id;
            }
            if start.elapsed() > Duration::from_secs(30) {
                // SAFETY: kills and reaps our own child.
                unsafe {
                    libc::kill(child, libc::SIGKILL);
                    libc::waitpid(child, std::ptr::null_mut(), 0);
                }
                panic!("the child made no token within 30 s");
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        assert!(alive(kid_tag));
        std::fs::remove_file(kid_tag.token_path()).unwrap();
        assert!(alive(kid_tag), "a missing token alone is no proof of death");
        let mut status = 0;
        // SAFETY: kills and reaps our own child.
        unsafe {
            libc::kill(child, libc::SIGKILL);
            libc::waitpid(child, &mut status, 0);
        }
        assert!(!alive(kid_tag));
    }

    #[test]
    fn a_queue_token_lives_while_any_party_holds_it() {
        let a = QueueToken::create(me().unwrap()).unwrap();
        let tag = a.tag();
        let b = QueueToken::join(tag).unwrap();
        assert!(LastHold::take(tag).is_none(), "held shared by two");
        assert!(a.leave().is_none(), "b still holds it");
        let last = b.leave().expect("the last party");
        assert!(
            QueueToken::join(tag).is_err(),
            "being removed: no new party"
        );
        drop(last);
        assert!(!std::path::Path::new(&tag.token_path()).exists());
        let err = QueueToken::join(tag).unwrap_err().to_string();
        assert!(err.contains("gone"), "{err}");
    }

    #[test]
    fn a_token_made_while_a_sweep_runs_is_always_named_and_held() {
        let _forks = crate::testing::forking();
        // Each child makes its token while the parent sweeps that child's names in a tight
        // loop: the sweep may remove a token it finds unlocked, but then its maker sees it
        // and makes another, so the child always ends with a token that is named and held.
        me().unwrap(); // hooks registered before the forks, not in the children
        crate::trust::unsplit(|| ());
        for _ in 0..20 {
            let mut fds = [0; 2];
            // SAFETY: pipe fills two descriptors.
            assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
            // SAFETY: the child makes its token, checks it, writes one byte and _exits.
            let child = unsafe { libc::fork() };
            if child == 0 {
                let ok = me().is_ok_and(|id| {
                    let c = crate::trust::c_path(&id.token_path()).unwrap();
                    match crate::trust::open_own(&c, libc::O_RDONLY) {
                        // SAFETY: a non-blocking probe on our own descriptor.
                        Opened::Ours(fd, _) => unsafe {
                            libc::flock(fd.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) != 0
                        },
                        _ => false,
                    }
                });
                let b = [u8::from(ok)];
                // SAFETY: writes one byte, then _exit (no destructors in a fork child).
                unsafe {
                    libc::write(fds[1], b.as_ptr().cast(), 1);
                    libc::_exit(0);
                }
            }
            let mut pfd = libc::pollfd {
                fd: fds[0],
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: polls our own pipe without waiting.
            while unsafe { libc::poll(&mut pfd, 1, 0) } == 0 {
                crate::sweep::sweep_pids(&[child as u32]);
            }
            let mut b = [0u8];
            // SAFETY: reads one byte into a local; reaps our child; closes our pipe.
            unsafe {
                assert_eq!(libc::read(fds[0], b.as_mut_ptr().cast(), 1), 1);
                libc::waitpid(child, std::ptr::null_mut(), 0);
                libc::close(fds[0]);
                libc::close(fds[1]);
            }
            assert_eq!(b[0], 1, "a child's token was not named and held");
            crate::sweep::sweep_pids(&[child as u32]);
        }
    }

    #[test]
    fn a_sweeper_removing_a_fresh_token_never_leaves_its_maker_without_one() {
        // Many makers race a burier that removes whatever token it finds unlocked.
        for _ in 0..20 {
            let q = QueueToken::create(me().unwrap()).unwrap();
            let path = q.tag().token_path();
            assert!(std::path::Path::new(&path).exists());
            // A burier cannot take a held token.
            assert!(!bury_at(
                &crate::trust::c_path(&path).unwrap(),
                Duration::ZERO
            ));
            assert!(LastHold::take(q.tag()).is_none());
        }
    }

    #[test]
    fn a_dead_owners_token_held_for_an_instant_by_a_prober_is_still_buried_by_its_watchdog() {
        // A dead process's genuine token (0600, ours), held shared for 20 ms by another
        // process that learned of the death at the same moment (here a thread's descriptor).
        let id = Identity {
            pid: i32::MAX as u32 - 13,
            nonce: (crate::trust::random_u64().unwrap() as u32).max(1),
        };
        let path = id.token_path();
        let c = crate::trust::c_path(&path).unwrap();
        let Ok(fd) = trust::create_own(&c) else {
            panic!("cannot create {path}");
        };
        // SAFETY: fd is ours; a shared lock, released when `fd` closes.
        assert_eq!(unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_SH) }, 0);
        let (go, gone) = std::sync::mpsc::channel::<()>();
        let prober = std::thread::spawn(move || {
            gone.recv().unwrap();
            std::thread::sleep(Duration::from_millis(20));
            drop(fd);
        });
        assert!(!bury(id), "one try finds the lock held");
        go.send(()).unwrap();
        // What `bury_dead` does, with a bound no stalled machine reaches.
        assert!(
            bury_at(&c, Duration::from_secs(60)),
            "asked again, it is removed"
        );
        assert!(!std::path::Path::new(&path).exists());
        prober.join().unwrap();
    }
}
