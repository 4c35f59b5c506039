//! An inter-process file lock with a timeout, on `flock(2)`.
//!
//! `flock` locks belong to an open file description, so two [`FileLock`]s on the same path
//! exclude each other across processes *and* across threads of one process, and the kernel
//! drops the lock when the holder's descriptor closes — including when the holder is killed.
//! The file is opened with `O_CLOEXEC`, so exec'd children do not inherit the lock. Waiting is a
//! non-blocking try in a loop with a growing pause (1 ms up to 20 ms), because `flock` has no
//! timeout of its own; callers pass a deadline and re-enter to check for signals in between.

use crate::error::{CoreError, Result};
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A lock on one path.
#[derive(Debug)]
pub struct FileLock {
    path: PathBuf,
    file: Option<File>,
}

impl FileLock {
    /// A lock on `path` (created if missing, with its parent folders); not yet acquired.
    pub fn new(path: impl AsRef<Path>) -> Self {
        FileLock {
            path: path.as_ref().to_path_buf(),
            file: None,
        }
    }

    /// The locked path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether this handle holds the lock.
    pub fn is_locked(&self) -> bool {
        self.file.is_some()
    }

    fn open(&self) -> Result<File> {
        if let Some(parent) = self.path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|e| CoreError::Io {
                context: format!("creating folder {} for a lock", parent.display()),
                source: e,
            })?;
        }
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .custom_flags(libc::O_CLOEXEC)
            .open(&self.path)
            .map_err(|e| CoreError::Io {
                context: format!("opening lock file {}", self.path.display()),
                source: e,
            })
    }

    /// Tries once; true if the lock is now held by this handle.
    pub fn try_acquire(&mut self) -> Result<bool> {
        if self.file.is_some() {
            return Err(CoreError::Invalid(format!(
                "the lock on {} is already held by this handle (it is not reentrant)",
                self.path.display()
            )));
        }
        let f = self.open()?;
        // SAFETY: flock on a descriptor we own; LOCK_NB never blocks.
        let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if r == 0 {
            self.file = Some(f);
            return Ok(true);
        }
        let err = std::io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EWOULDBLOCK) | Some(libc::EINTR) => Ok(false),
            _ => Err(CoreError::Io {
                context: format!("flock {}", self.path.display()),
                source: err,
            }),
        }
    }

    /// Waits for the lock until `deadline` (`None`: forever). Returns false if the deadline
    /// passed first.
    pub fn acquire_until(&mut self, deadline: Option<Instant>) -> Result<bool> {
        let mut pause = Duration::from_millis(1);
        loop {
            if self.try_acquire()? {
                return Ok(true);
            }
            let now = Instant::now();
            let sleep = match deadline {
                Some(d) if d <= now => return Ok(false),
                Some(d) => pause.min(d - now),
                None => pause,
            };
            std::thread::sleep(sleep);
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }

    /// Releases the lock (a no-op if not held).
    pub fn release(&mut self) {
        if let Some(f) = self.file.take() {
            // SAFETY: unlocking a descriptor we own; closing it (drop) would unlock as well.
            unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_UN) };
        }
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        std::env::temp_dir()
            .join(format!("easycore-lock-test-{}", std::process::id()))
            .join(name)
    }

    #[test]
    fn excludes_a_second_handle_and_releases() {
        let p = tmp("a.lock");
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
        use std::sync::Arc;
        let p = tmp("b.lock");
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
}
