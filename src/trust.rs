//! Opening names in `/dev/shm` without trusting them, unguessable names, and sections of code
//! that no `fork` may split.
//!
//! `/dev/shm` is one world-writable (sticky) folder shared by every user of the machine, and
//! by containers started with `--ipc=host`. Another local user may create, replace, lock or
//! fill any name there at any moment; they cannot remove or rename *our* files (the sticky
//! bit), nor open files we made with mode 0600. So every name the core uses follows these
//! rules, which this module implements once for segments ([`crate::shm`]) and liveness tokens
//! ([`crate::liveness`]):
//! * **create** with `O_CREAT | O_EXCL`, mode 0600 (the umask can only take bits away), never
//!   following a link ([`create_own`]): a name someone else holds is `EEXIST`, and the caller
//!   picks another random name;
//! * **open** with `O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC` and then `fstat` the descriptor
//!   ([`open_own`]): anything that is not a regular file owned by our effective uid with no
//!   group or other permission bit is refused ([`Opened::NotOurs`]) before a byte of it is
//!   read or mapped. A symlink fails with `ELOOP`; a FIFO opens at once (non-blocking) and is
//!   refused by the `fstat`; a directory is refused the same way; nothing ever blocks;
//! * **names** carry at least 64 random bits from `getrandom` ([`random_u64`]) where a name
//!   must not be guessed before it exists (names that exist are listed by `ls /dev/shm`, so
//!   their secrecy is never relied upon).
//!
//! Fork sections ([`unsplit`]): a descriptor that carries a lock (a liveness token, a file
//! lock) must be known to the `pthread_atfork` child handler that lets go of it in a forked
//! child. Between `open()` returning and the descriptor being recorded, a fork from another
//! thread would hand the child an unknown copy, which would keep the parent's lock alive
//! after the parent's death. Such steps run inside [`unsplit`]: a fork waits (in its prepare
//! handler, at most [`FORK_WAIT`]) until no thread is inside one, and no thread enters one
//! while a fork is under way.

use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The longest a `fork` waits for threads inside an [`unsplit`] section (each lasts a few
/// system calls; the bound only guards against the unforeseen).
pub const FORK_WAIT: Duration = Duration::from_secs(1);

/// 64 random bits from the kernel (`getrandom`, else `/dev/urandom`). Never a mix of time and
/// pid: names built from it must not be guessable by another user.
pub fn random_u64() -> std::io::Result<u64> {
    let mut v = 0u64;
    let mut got = 0usize;
    while got < 8 {
        // SAFETY: getrandom writes at most `8 - got` bytes at offset `got` of the local `v`.
        let n = unsafe {
            libc::getrandom(
                (&mut v as *mut u64).cast::<u8>().add(got).cast(),
                8 - got,
                0,
            )
        };
        if n > 0 {
            got += n as usize;
            continue;
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        // No getrandom (very old kernels, seccomp): the device gives the same bits.
        use std::io::Read;
        let mut buf = [0u8; 8];
        std::fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
        return Ok(u64::from_ne_bytes(buf));
    }
    Ok(v)
}

/// What [`open_own`] found under a name.
#[derive(Debug)]
pub enum Opened {
    /// A regular file of ours (owner = our euid, no group/other bits), with its `fstat`.
    Ours(OwnedFd, libc::stat),
    /// Nothing under the name.
    Missing,
    /// Something we did not make: a link, a FIFO, a directory, another user's file, or a file
    /// with group/other access. Never read, never mapped. The text says what it is.
    NotOurs(String),
    /// Any other error of `open`/`fstat`.
    Failed(std::io::Error),
}

/// Why the file `st` is not one of ours, or `None` if it is: a regular file owned by our
/// effective uid with no permission bit for group or others.
pub fn not_ours(st: &libc::stat) -> Option<String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    let kind = st.st_mode & libc::S_IFMT;
    if kind != libc::S_IFREG {
        let what = match kind {
            libc::S_IFIFO => "a FIFO",
            libc::S_IFDIR => "a directory",
            libc::S_IFLNK => "a symbolic link",
            libc::S_IFSOCK => "a socket",
            libc::S_IFCHR | libc::S_IFBLK => "a device",
            _ => "not a regular file",
        };
        return Some(format!("{what} (owner uid {})", st.st_uid));
    }
    if st.st_uid != me {
        return Some(format!(
            "a file of uid {}, not of this process's uid {me}",
            st.st_uid
        ));
    }
    if st.st_mode & 0o077 != 0 {
        return Some(format!(
            "a file with mode {:04o} (ours are 0600: someone else may have written it)",
            st.st_mode & 0o7777
        ));
    }
    None
}

/// The `fstat` of an open descriptor.
pub fn fstat(fd: libc::c_int) -> std::io::Result<libc::stat> {
    // SAFETY: fstat fills the zeroed struct we own; fd is the caller's open descriptor.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st)
}

/// Opens `path` (read-only or read-write, as `flags` says) trusting nothing: no link is
/// followed, nothing blocks (a FIFO opens at once), and the descriptor is kept only if it is a
/// regular file of ours (see [`not_ours`]).
pub fn open_own(path: &CStr, flags: libc::c_int) -> Opened {
    // SAFETY: valid C string; the descriptor is owned by the OwnedFd below.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            flags | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY,
        )
    };
    if fd < 0 {
        let err = std::io::Error::last_os_error();
        return match err.raw_os_error() {
            Some(libc::ENOENT) => Opened::Missing,
            Some(libc::ELOOP) => Opened::NotOurs("a symbolic link".into()),
            // A FIFO opened for writing with no reader, a socket, a device without driver.
            Some(libc::ENXIO) | Some(libc::EOPNOTSUPP) | Some(libc::ENODEV) => {
                Opened::NotOurs("not a regular file".into())
            }
            Some(libc::EACCES) | Some(libc::EPERM) => {
                Opened::NotOurs("a file this process may not open (another user's)".into())
            }
            Some(libc::EISDIR) => Opened::NotOurs("a directory".into()),
            _ => Opened::Failed(err),
        };
    }
    // SAFETY: fd was just opened and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    match fstat(fd.as_raw_fd()) {
        Err(e) => Opened::Failed(e),
        Ok(st) => match not_ours(&st) {
            Some(why) => Opened::NotOurs(why),
            None => Opened::Ours(fd, st),
        },
    }
}

/// Creates `path` exclusively (`O_CREAT | O_EXCL`, mode 0600, no link followed, non-blocking,
/// close-on-exec), read-write, and checks it with `fstat` like [`open_own`]. `EEXIST` means
/// the name is taken (by anyone): the caller picks another.
pub fn create_own(path: &CStr) -> std::io::Result<OwnedFd> {
    // SAFETY: valid C string; O_EXCL creates a new file or fails.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_CREAT
                | libc::O_EXCL
                | libc::O_RDWR
                | libc::O_NOFOLLOW
                | libc::O_NONBLOCK
                | libc::O_CLOEXEC
                | libc::O_NOCTTY,
            0o600 as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd was just created and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let st = fstat(fd.as_raw_fd())?;
    if let Some(why) = not_ours(&st) {
        // Cannot happen with O_EXCL (the file is new and ours); refuse rather than trust.
        return Err(std::io::Error::other(format!(
            "{} was created as {why}",
            path.to_string_lossy()
        )));
    }
    Ok(fd)
}

/// Whether `path` still names the file open as `fd` (same device and inode; a link at the
/// path is not followed).
pub fn still_named(fd: libc::c_int, path: &CStr) -> bool {
    let Ok(mine) = fstat(fd) else { return false };
    // SAFETY: lstat fills the zeroed struct we own; path is a valid C string.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::lstat(path.as_ptr(), &mut st) } != 0 {
        return false;
    }
    st.st_dev == mine.st_dev && st.st_ino == mine.st_ino
}

/// `path` as a C string (a path with a NUL byte is refused).
pub fn c_path(path: &str) -> std::io::Result<CString> {
    CString::new(path).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))
}

/// `flock(fd, op | LOCK_NB)`, retried while it fails with `EWOULDBLOCK`, for at most `wait`
/// (short waits: a same-user prober holds a token's lock for a few system calls). True once
/// granted.
pub fn flock_within(fd: libc::c_int, op: libc::c_int, wait: Duration) -> bool {
    let start = Instant::now();
    let mut pause = Duration::from_micros(50);
    loop {
        // SAFETY: fd is the caller's open descriptor; a non-blocking flock never waits.
        if unsafe { libc::flock(fd, op | libc::LOCK_NB) } == 0 {
            return true;
        }
        let err = std::io::Error::last_os_error().raw_os_error();
        if err != Some(libc::EWOULDBLOCK) && err != Some(libc::EINTR) {
            return false;
        }
        if start.elapsed() >= wait {
            return false;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(5));
    }
}

/// Threads inside an [`unsplit`] section (low 16 bits) and forks under way (high 16 bits).
static GATE: AtomicU32 = AtomicU32::new(0);
const FORKING: u32 = 1 << 16;
/// Whether the fork handlers are registered (a flag, not a `Once`: see `liveness`).
static GATE_HOOKS: AtomicBool = AtomicBool::new(false);

extern "C" fn gate_prepare() {
    GATE.fetch_add(FORKING, Ordering::SeqCst);
    let start = Instant::now();
    while GATE.load(Ordering::SeqCst) & 0xffff != 0 && start.elapsed() < FORK_WAIT {
        std::thread::yield_now();
    }
}

extern "C" fn gate_parent() {
    GATE.fetch_sub(FORKING, Ordering::SeqCst);
}

extern "C" fn gate_child() {
    // Only the forking thread lives on, and it was inside no section.
    GATE.store(0, Ordering::SeqCst);
}

/// Runs `f` so that no `fork` of this process happens while it runs (see the module's
/// documentation). `f` must be short, must not fork, and must not enter another section.
pub fn unsplit<T>(f: impl FnOnce() -> T) -> T {
    if !GATE_HOOKS.swap(true, Ordering::AcqRel) {
        // SAFETY: registers plain extern "C" functions without captured state; they only
        // touch an atomic (the child handler is async-signal-safe, as fork requires).
        unsafe { libc::pthread_atfork(Some(gate_prepare), Some(gate_parent), Some(gate_child)) };
    }
    loop {
        let v = GATE.load(Ordering::SeqCst);
        if v & !0xffff == 0
            && GATE
                .compare_exchange(v, v + 1, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        {
            break;
        }
        std::thread::yield_now();
    }
    struct Leave;
    impl Drop for Leave {
        fn drop(&mut self) {
            GATE.fetch_sub(1, Ordering::SeqCst);
        }
    }
    let _leave = Leave;
    f()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn shm_path(tag: &str) -> String {
        format!(
            "/dev/shm/ec.trust-test-{}-{tag}-{:x}",
            std::process::id(),
            random_u64().unwrap()
        )
    }

    #[test]
    fn random_bits_differ() {
        let a = random_u64().unwrap();
        let b = random_u64().unwrap();
        assert_ne!(a, b);
    }

    #[test]
    fn a_file_of_ours_is_accepted_and_created_exclusively() {
        let p = shm_path("own");
        let c = c_path(&p).unwrap();
        let fd = create_own(&c).unwrap();
        assert!(still_named(fd.as_raw_fd(), &c));
        assert_eq!(
            create_own(&c).unwrap_err().raw_os_error(),
            Some(libc::EEXIST)
        );
        assert!(matches!(open_own(&c, libc::O_RDWR), Opened::Ours(..)));
        std::fs::remove_file(&p).unwrap();
        assert!(!still_named(fd.as_raw_fd(), &c));
        assert!(matches!(open_own(&c, libc::O_RDWR), Opened::Missing));
    }

    #[test]
    fn links_fifos_directories_and_open_modes_are_refused_without_blocking() {
        let target = shm_path("target");
        std::fs::write(&target, b"x").unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).unwrap();
        let link = shm_path("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let fifo = shm_path("fifo");
        let cf = c_path(&fifo).unwrap();
        // SAFETY: valid C string.
        assert_eq!(unsafe { libc::mkfifo(cf.as_ptr(), 0o666) }, 0);
        let dir = shm_path("dir");
        std::fs::create_dir(&dir).unwrap();
        let open = shm_path("open");
        std::fs::write(&open, b"x").unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
        for (p, what) in [
            (&link, "symbolic link"),
            (&fifo, "FIFO"),
            (&dir, "directory"),
            (&open, "mode 0644"),
        ] {
            let c = c_path(p).unwrap();
            for flags in [libc::O_RDONLY, libc::O_RDWR] {
                match open_own(&c, flags) {
                    Opened::NotOurs(why) => assert!(
                        why.contains(what) || (what == "directory" && why.contains("director")),
                        "{p}: {why}"
                    ),
                    other => panic!("{p} ({what}) was not refused: {other:?}"),
                }
            }
        }
        // Another user's file (as root, hand it to nobody; else skip this part).
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            let theirs = shm_path("theirs");
            std::fs::write(&theirs, b"x").unwrap();
            std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o600)).unwrap();
            std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
            match open_own(&c_path(&theirs).unwrap(), libc::O_RDWR) {
                Opened::NotOurs(why) => assert!(why.contains("uid 65534"), "{why}"),
                other => panic!("another user's file was not refused: {other:?}"),
            }
            std::fs::remove_file(&theirs).unwrap();
        }
        for p in [&target, &link, &fifo, &open] {
            std::fs::remove_file(p).unwrap();
        }
        std::fs::remove_dir(&dir).unwrap();
    }

    #[test]
    fn a_section_runs_and_forks_still_work() {
        let _forks = crate::testing::forking();
        let v = unsplit(|| 41 + 1);
        assert_eq!(v, 42);
        // SAFETY: the child only _exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let ok = unsplit(|| true);
            // SAFETY: _exit in a forked child.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: reaps our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
        assert_eq!(GATE.load(Ordering::SeqCst) & 0xffff, 0);
    }
}
