//! An inter-process file lock with a timeout, on `flock(2)`.
//!
//! `flock` locks belong to an open file description, so two [`FileLock`]s on the same path
//! exclude each other across processes *and* across threads of one process, and the kernel
//! drops the lock when the holder's descriptor closes — including when the holder is killed.
//! The file is opened with `O_CLOEXEC`, so exec'd children do not inherit the lock. Waiting is a
//! non-blocking try in a loop with a growing pause (1 ms up to 20 ms), because `flock` has no
//! timeout of its own; callers pass a deadline and re-enter to check for signals in between.
//!
//! Two hazards of `flock` are handled here:
//!
//! * **fork.** A forked child shares the parent's open file description, so a `LOCK_UN` from
//!   the child would release the *parent's* lock, and a child that lives on would keep the lock
//!   alive after its parent died. So, in a forked child, every lock-file descriptor inherited
//!   from the parent is pointed at `/dev/null` at once (a `pthread_atfork` handler): the child
//!   holds no reference to the lock at all, and the parent's death releases it. A handle also
//!   remembers the pid that took the lock; in any other process it only closes its descriptor.
//!   The `open` and the registration run in one [`crate::trust::unsplit`] section, so no
//!   fork lands between them (a child would inherit a descriptor the handler does not know).
//!   (At most [`FORK_SLOTS`] descriptors open at the same moment are tracked; more is unheard of.)
//! * **removed lock files.** After taking the lock, the handle checks that the path still names
//!   the file it locked (same device and inode). If someone removed or replaced the file in the
//!   meantime, it lets go and tries again on the new file. So a holder may delete the lock file
//!   before releasing without ever letting two holders in.
//!
//! [`SharedFileLock`] wraps a handle for use by several threads: a thread that finds the lock
//! taken by another thread waits, as for any other holder.

use crate::error::{CoreError, Result};
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Mutex, Once};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

/// The longest pause between two tries.
const MAX_PAUSE: Duration = Duration::from_millis(20);

/// How many lock-file descriptors open at the same moment a forked child lets go of.
pub const FORK_SLOTS: usize = 64;

/// The lock-file descriptors open in this process (-1: a free slot). Each is set from just
/// after `open` until just before `close`.
static OPEN_FDS: [AtomicI32; FORK_SLOTS] = [const { AtomicI32::new(-1) }; FORK_SLOTS];
static ATFORK: Once = Once::new();

/// Runs in the child of every `fork`: points each inherited lock-file descriptor at
/// `/dev/null`, so the child holds no reference to the parent's locks (the descriptor number
/// stays valid for the child's copy of the handle, which closes it later).
extern "C" fn let_go_in_forked_child() {
    for slot in &OPEN_FDS {
        let fd = slot.load(Ordering::Relaxed);
        if fd < 0 {
            continue;
        }
        // SAFETY: open, dup2, fcntl and close are async-signal-safe, as a fork handler needs;
        // `fd` was open in the parent at the fork, so it is open here, and dup2 replaces it
        // atomically with /dev/null.
        unsafe {
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
            if null >= 0 {
                libc::dup2(null, fd);
                libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
                libc::close(null);
            }
        }
    }
}

/// An open lock file, listed in [`OPEN_FDS`] while it is open.
#[derive(Debug)]
struct LockFd {
    file: File,
}

impl LockFd {
    fn new(file: File) -> Self {
        ATFORK.call_once(|| {
            // SAFETY: registers a plain function with no state; it is never unregistered.
            unsafe { libc::pthread_atfork(None, None, Some(let_go_in_forked_child)) };
        });
        let fd = file.as_raw_fd();
        for slot in &OPEN_FDS {
            if slot
                .compare_exchange(-1, fd, Ordering::SeqCst, Ordering::Relaxed)
                .is_ok()
            {
                break;
            }
        }
        LockFd { file }
    }
}

impl Drop for LockFd {
    fn drop(&mut self) {
        let fd = self.file.as_raw_fd();
        for slot in &OPEN_FDS {
            if slot
                .compare_exchange(fd, -1, Ordering::SeqCst, Ordering::Relaxed)
                .is_ok()
            {
                break;
            }
        }
        // `file` closes after this, once the slot is free.
    }
}

/// A lock on one path.
#[derive(Debug)]
pub struct FileLock {
    path: PathBuf,
    /// The locked file, while this handle holds the lock; `owner` is the pid that locked it.
    file: Option<LockFd>,
    owner: u32,
}

impl FileLock {
    /// A lock on `path` (created if missing, with its parent folders); not yet acquired.
    pub fn new(path: impl AsRef<Path>) -> Self {
        FileLock {
            path: path.as_ref().to_path_buf(),
            file: None,
            owner: 0,
        }
    }

    /// The locked path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether this handle holds the lock (in this process: a forked child's copy does not).
    pub fn is_locked(&self) -> bool {
        self.file.is_some() && self.owner == std::process::id()
    }

    /// Forgets a lock inherited through `fork`: closes the descriptor without `LOCK_UN`, which
    /// would release the lock of the process that took it.
    fn forget_inherited(&mut self) {
        if self.file.is_some() && self.owner != std::process::id() {
            drop(self.file.take());
        }
    }

    /// Opens (creating) the lock file and its folder. A folder removed by someone else between
    /// the two steps (an emptied lock area is removed) is made again, a few times.
    fn open(&self) -> Result<LockFd> {
        let mut tries = 0;
        loop {
            if let Some(parent) = self.path.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent).map_err(|e| CoreError::Io {
                    context: format!("creating folder {} for a lock", parent.display()),
                    source: e,
                })?;
            }
            // Open and register in one section no fork may split: a child forked in between
            // would inherit a descriptor its fork handler does not know, and keep the lock
            // we are about to take alive after our death.
            let opened = crate::trust::unsplit(|| {
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .mode(0o644)
                    .custom_flags(libc::O_CLOEXEC)
                    .open(&self.path)
                    .map(LockFd::new)
            });
            match opened {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && tries < 8 => tries += 1,
                other => {
                    return other.map_err(|e| CoreError::Io {
                        context: format!("opening lock file {}", self.path.display()),
                        source: e,
                    })
                }
            }
        }
    }

    /// Whether the path still names the file `f` (it was not removed or replaced).
    fn still_named(&self, f: &LockFd) -> Result<bool> {
        let mine = f.file.metadata().map_err(|e| CoreError::Io {
            context: format!("fstat lock file {}", self.path.display()),
            source: e,
        })?;
        match std::fs::metadata(&self.path) {
            Ok(now) => Ok(now.dev() == mine.dev() && now.ino() == mine.ino()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(CoreError::Io {
                context: format!("stat lock file {}", self.path.display()),
                source: e,
            }),
        }
    }

    /// Tries once; true if the lock is now held by this handle.
    pub fn try_acquire(&mut self) -> Result<bool> {
        self.forget_inherited();
        if self.file.is_some() {
            return Err(CoreError::Invalid(format!(
                "the lock on {} is already held by this handle (it is not reentrant)",
                self.path.display()
            )));
        }
        let f = self.open()?;
        // SAFETY: flock on a descriptor we own; LOCK_NB never blocks.
        let r = unsafe { libc::flock(f.file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if r != 0 {
            let err = std::io::Error::last_os_error();
            return match err.raw_os_error() {
                Some(libc::EWOULDBLOCK) | Some(libc::EINTR) => Ok(false),
                _ => Err(CoreError::Io {
                    context: format!("flock {}", self.path.display()),
                    source: err,
                }),
            };
        }
        if !self.still_named(&f)? {
            // The holder we waited for removed the file: our lock is on a file no one else
            // will look at. Closing `f` drops it; the next try opens the new file.
            return Ok(false);
        }
        self.file = Some(f);
        self.owner = std::process::id();
        Ok(true)
    }

    /// Waits for the lock until `deadline` (`None`: forever). Returns false if the deadline
    /// passed first.
    pub fn acquire_until(&mut self, deadline: Option<Instant>) -> Result<bool> {
        let mut pause = Duration::from_millis(1);
        loop {
            if self.try_acquire()? {
                return Ok(true);
            }
            if !pause_until(deadline, &mut pause) {
                return Ok(false);
            }
        }
    }

    /// Releases the lock (a no-op if not held). In a forked child, only the child's copy of the
    /// descriptor is closed: the lock stays with the process that took it.
    pub fn release(&mut self) {
        self.forget_inherited();
        if let Some(f) = self.file.take() {
            // SAFETY: unlocking a descriptor we own, in the process that locked it (checked by
            // forget_inherited above); closing it (drop) would unlock as well.
            unsafe { libc::flock(f.file.as_raw_fd(), libc::LOCK_UN) };
        }
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        self.release();
    }
}

/// Sleeps for `pause` (at most until `deadline`) and doubles it up to [`MAX_PAUSE`]; false,
/// without sleeping, if the deadline has passed.
fn pause_until(deadline: Option<Instant>, pause: &mut Duration) -> bool {
    let now = Instant::now();
    let sleep = match deadline {
        Some(d) if d <= now => return false,
        Some(d) => (*pause).min(d - now),
        None => *pause,
    };
    std::thread::sleep(sleep);
    *pause = (*pause * 2).min(MAX_PAUSE);
    true
}

/// Who holds a lock that could not be taken, as far as this process can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    /// Another thread of this process holds the same lock object.
    OtherThread,
    /// This process holds the lock through another handle (another lock object, same file).
    ThisProcess,
    /// Another process, by pid (from `/proc/locks`).
    Process(u32),
    /// Someone else; the kernel did not say who.
    Unknown,
}

struct Shared {
    lock: FileLock,
    /// The thread that took the lock through this object, while it holds it.
    thread: Option<ThreadId>,
}

/// A [`FileLock`] that several threads may share: one that finds it held by another thread
/// waits, as it would for another process; one that enters it twice gets an error instead of a
/// deadlock. Any thread may release it (as with `threading.Lock`).
pub struct SharedFileLock {
    path: PathBuf,
    inner: Mutex<Shared>,
}

impl SharedFileLock {
    /// A lock on `path`; not yet acquired.
    pub fn new(path: impl AsRef<Path>) -> Self {
        SharedFileLock {
            path: path.as_ref().to_path_buf(),
            inner: Mutex::new(Shared {
                lock: FileLock::new(path),
                thread: None,
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The locked path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether this object holds the lock (through any thread of this process).
    pub fn is_locked(&self) -> bool {
        self.state().lock.is_locked()
    }

    /// Waits for the lock until `deadline` (`None`: forever); false if the deadline passed
    /// first. Fails if the calling thread already holds it through this object.
    pub fn acquire_until(&self, deadline: Option<Instant>) -> Result<bool> {
        let me = std::thread::current().id();
        let mut pause = Duration::from_millis(1);
        loop {
            {
                let mut s = self.state();
                if s.lock.is_locked() {
                    if s.thread == Some(me) {
                        return Err(CoreError::Invalid(format!(
                            "this thread already holds the lock on {}: it is not reentrant \
                             (entering it again would wait for ever)",
                            self.path.display()
                        )));
                    }
                } else if s.lock.try_acquire()? {
                    s.thread = Some(me);
                    return Ok(true);
                }
            }
            if !pause_until(deadline, &mut pause) {
                return Ok(false);
            }
        }
    }

    /// Releases the lock (a no-op if not held).
    pub fn release(&self) {
        let mut s = self.state();
        s.thread = None;
        s.lock.release();
    }

    /// Who holds the lock, for an error message after a timeout.
    pub fn holder(&self) -> Holder {
        {
            let s = self.state();
            if s.lock.is_locked() && s.thread != Some(std::thread::current().id()) {
                return Holder::OtherThread;
            }
        }
        match flock_holder(&self.path) {
            Some(pid) if pid == std::process::id() => Holder::ThisProcess,
            Some(pid) => Holder::Process(pid),
            None => Holder::Unknown,
        }
    }
}

/// How many times [`flock_holder`] reads `/proc/locks` before it says nobody is listed.
const HOLDER_SCANS: usize = 16;

/// The pid that holds an `flock` on `path` (Linux; None elsewhere or if it is not listed).
///
/// A lock held through a descriptor of this process is read from that descriptor's
/// `/proc/self/fdinfo` entry: one small read, made under the file's lock list, so always
/// complete. Others come from `/proc/locks`, which the kernel hands out a page at a time,
/// taking its lock for each page: a read while other locks come and go can skip a line (an
/// entry that moved to a page already read; measured: 12 of 300 reads missed a held lock
/// beside three threads cycling 180 locks). A lock held all along is in almost every read,
/// so that table is read up to [`HOLDER_SCANS`] times before the answer is "not listed"
/// (the answer names a holder in an error message: at worst it names nobody).
pub fn flock_holder(path: &Path) -> Option<u32> {
    #[cfg(target_os = "linux")]
    {
        let meta = std::fs::metadata(path).ok()?;
        let dev = meta.dev();
        let id = format!(
            "{:02x}:{:02x}:{}",
            libc::major(dev),
            libc::minor(dev),
            meta.ino()
        );
        own_flock_holder(&id).or_else(|| (0..HOLDER_SCANS).find_map(|_| listed_flock_holder(&id)))
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = path;
        None
    }
}

/// The pid of an `flock` on the file `id` (`major:minor:inode`) held through one of this
/// process's descriptors, from their `fdinfo` (`lock:` lines, as in `/proc/locks`).
#[cfg(target_os = "linux")]
fn own_flock_holder(id: &str) -> Option<u32> {
    std::fs::read_dir("/proc/self/fdinfo")
        .ok()?
        .flatten()
        .find_map(|e| {
            let info = std::fs::read_to_string(e.path()).ok()?;
            info.lines()
                .find_map(|l| flock_pid_in(l.strip_prefix("lock:")?, id))
        })
}

/// One read of `/proc/locks`: the pid of an `flock` on the file `id`.
#[cfg(target_os = "linux")]
fn listed_flock_holder(id: &str) -> Option<u32> {
    let table = std::fs::read_to_string("/proc/locks").ok()?;
    table.lines().find_map(|line| flock_pid_in(line, id))
}

/// The pid in one lock line (`1: FLOCK  ADVISORY  WRITE 12345 08:01:1234567 0 EOF`) if it
/// is an `flock` on the file `id`.
#[cfg(target_os = "linux")]
fn flock_pid_in(line: &str, id: &str) -> Option<u32> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    let kind = fields.get(1)?;
    let at = fields.iter().position(|f| *f == id)?;
    if *kind != "FLOCK" || at < 1 {
        return None;
    }
    fields[at - 1].parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::thread::JoinHandle;

    /// A test's own directory, removed when the test ends, failed or not (a test run leaves
    /// nothing in the temporary directory).
    struct TmpDir(PathBuf);

    impl TmpDir {
        fn new(test: &str) -> Self {
            let dir = std::env::temp_dir()
                .join(format!("easycore-lock-test-{}-{test}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            Self(dir)
        }

        fn join(&self, name: &str) -> PathBuf {
            self.0.join(name)
        }
    }

    impl Drop for TmpDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn excludes_a_second_handle_and_releases() {
        let dir = TmpDir::new("excl");
        let p = dir.join("a.lock");
        let mut a = FileLock::new(&p);
        let mut b = FileLock::new(&p);
        assert!(a.try_acquire().unwrap());
        assert!(!b.try_acquire().unwrap());
        let t = Instant::now();
        assert!(!b
            .acquire_until(Some(Instant::now() + Duration::from_millis(30)))
            .unwrap());
        assert!(t.elapsed() >= Duration::from_millis(30));
        a.release();
        assert!(b.try_acquire().unwrap());
        assert!(b.try_acquire().is_err(), "not reentrant");
        drop(b);
        assert!(a.try_acquire().unwrap());
    }

    #[test]
    fn threads_take_turns() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let dir = TmpDir::new("turns");
        let p = dir.join("b.lock");
        let inside = Arc::new(AtomicUsize::new(0));
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let (p, inside) = (p.clone(), inside.clone());
                std::thread::spawn(move || {
                    for _ in 0..25 {
                        let mut l = FileLock::new(&p);
                        assert!(l.acquire_until(None).unwrap());
                        assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0);
                        std::thread::yield_now();
                        inside.fetch_sub(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
    }

    #[test]
    fn one_shared_object_makes_threads_wait() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let dir = TmpDir::new("shared");
        let lock = Arc::new(SharedFileLock::new(dir.join("c.lock")));
        let inside = Arc::new(AtomicUsize::new(0));
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let (lock, inside) = (lock.clone(), inside.clone());
                std::thread::spawn(move || {
                    for _ in 0..25 {
                        assert!(lock.acquire_until(None).unwrap());
                        assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0);
                        std::thread::yield_now();
                        inside.fetch_sub(1, Ordering::SeqCst);
                        lock.release();
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert!(lock.acquire_until(None).unwrap());
        assert!(
            lock.acquire_until(None).is_err(),
            "same thread: not reentrant"
        );
        lock.release();
    }

    #[test]
    fn a_removed_lock_file_is_not_trusted() {
        let dir = TmpDir::new("removed");
        let p = dir.join("d.lock");
        let mut a = FileLock::new(&p);
        let mut b = FileLock::new(&p);
        assert!(a.try_acquire().unwrap());
        // b opens the old file and waits on it; a removes the file, then releases.
        let f = b.open().unwrap();
        std::fs::remove_file(&p).unwrap();
        a.release();
        // SAFETY: flock on a descriptor we own; LOCK_NB never blocks.
        assert_eq!(
            unsafe { libc::flock(f.file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
            0
        );
        assert!(!b.still_named(&f).unwrap(), "the lock is on a removed file");
        drop(f);
        assert!(b.try_acquire().unwrap(), "a new file is made and locked");
        assert!(!a.try_acquire().unwrap());
    }

    /// Threads that take and release `each` locks on files of their own until told to stop.
    fn churn(dir: &TmpDir, threads: usize, each: usize) -> (Arc<AtomicBool>, Vec<JoinHandle<()>>) {
        let stop = Arc::new(AtomicBool::new(false));
        let hs = (0..threads)
            .map(|t| {
                let paths: Vec<PathBuf> = (0..each)
                    .map(|i| dir.join(&format!("c{t}-{i}.lock")))
                    .collect();
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || {
                    let mut locks: Vec<FileLock> = paths.iter().map(FileLock::new).collect();
                    while !stop.load(Ordering::Relaxed) {
                        for l in &mut locks {
                            assert!(l.try_acquire().unwrap());
                        }
                        for l in &mut locks {
                            l.release();
                        }
                    }
                })
            })
            .collect();
        (stop, hs)
    }

    /// A lock file in `dir` and this process's exclusive lock on it.
    #[cfg(target_os = "linux")]
    fn held(dir: &TmpDir) -> (PathBuf, FileLock) {
        let p = dir.join("held.lock");
        let mut a = FileLock::new(&p);
        assert!(a.try_acquire().unwrap());
        (p, a)
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn names_the_holding_pid_while_other_locks_come_and_go() {
        // Enough locks for /proc/locks to span pages, which the kernel hands out one by one.
        let dir = TmpDir::new("holder-churn");
        let (p, _held) = held(&dir);
        let (stop, hs) = churn(&dir, 3, 60);
        let named = (0..300)
            .filter(|_| flock_holder(&p) == Some(std::process::id()))
            .count();
        stop.store(true, Ordering::Relaxed);
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(named, 300, "a lookup missed a lock held all along");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn names_the_holding_pid() {
        let dir = TmpDir::new("holder");
        let (p, mut a) = held(&dir);
        assert_eq!(flock_holder(&p), Some(std::process::id()));
        let shared = SharedFileLock::new(&p);
        assert_eq!(shared.holder(), Holder::ThisProcess);
        a.release();
        assert_eq!(flock_holder(&p), None);
    }
}
