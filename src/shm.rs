//! Named POSIX shared-memory segments: create, attach by name, unlink, and unmap on drop.
//!
//! Names are `/ec.<owner tag>.<nonce>`, where the tag `<pid>-<nonce>` is the [`Identity`] of the
//! process that owns the segment's lifetime, so that [`sweep_stale`] can remove what a killed
//! owner left behind, judging the owner by its liveness token (never by its pid alone: a
//! live owner in another PID namespace sharing `/dev/shm` is never swept).
//!
//! Lifetime rules:
//! * The creating process owns the name: dropping its [`Segment`] unlinks it unless
//!   [`Segment::unlink`] already did. A forked child holds a copy of the handle but never
//!   unlinks on drop (the pid check), so fork does not double-unlink.
//! * Everyone else only unmaps on drop.
//! * Callers unlink as soon as every party has attached; after that a SIGKILL of anyone leaks
//!   nothing, because the kernel frees the memory with the last mapping.
//! * Space is committed at creation (`posix_fallocate`), so a full `/dev/shm` is a clear
//!   [`CoreError::NoSpace`] at once, never a `SIGBUS` on first touch.

use crate::error::{CoreError, Result};
use crate::liveness::{self, Identity};
use crate::wait::current_pid;
use std::ffi::CString;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Prefix of every segment name this library creates.
pub const NAME_PREFIX: &str = "ec.";

/// A mapped shared-memory segment.
#[derive(Debug)]
pub struct Segment {
    name: String,
    ptr: NonNull<u8>,
    len: usize,
    /// pid of the process that created it here, if this handle created it
    creator: Option<u32>,
    unlinked: AtomicBool,
}

// SAFETY: the mapping is plain memory shared by design; all access to its contents goes through
// atomics or through byte copies whose exclusivity the queue protocol guarantees. The handle
// itself holds no thread-bound state.
unsafe impl Send for Segment {}
// SAFETY: as above; `&Segment` only exposes the base pointer, the length and idempotent unlink.
unsafe impl Sync for Segment {}

/// A fresh, unused-looking segment name owned by `owner`.
pub fn new_name_for(owner: Identity) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let c = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mix = (t ^ (c.wrapping_mul(0x9E37_79B9_7F4A_7C15)) ^ (u64::from(current_pid()) << 32))
        .wrapping_mul(0xBF58_476D_1CE4_E5B9);
    format!("/{NAME_PREFIX}{}.{:08x}", owner.tag(), (mix >> 32) as u32)
}

fn c_name(name: &str) -> Result<CString> {
    CString::new(name).map_err(|_| CoreError::Invalid(format!("bad segment name {name:?}")))
}

/// Free and total bytes of the shared-memory file system, where it can be asked.
pub fn shm_space() -> Option<(u64, u64)> {
    let path = CString::new("/dev/shm").ok()?;
    // SAFETY: statvfs writes into the zeroed struct we own; path is a valid C string.
    unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(path.as_ptr(), &mut st) != 0 {
            return None;
        }
        let bs = st.f_frsize as u64;
        Some((st.f_bavail as u64 * bs, st.f_blocks as u64 * bs))
    }
}

fn no_space(requested: u64) -> CoreError {
    let space = shm_space();
    CoreError::NoSpace {
        requested,
        available: space.map(|s| s.0),
        total: space.map(|s| s.1),
    }
}

fn map(fd: libc::c_int, len: usize, name: &str) -> Result<NonNull<u8>> {
    #[cfg(target_os = "linux")]
    let flags = libc::MAP_SHARED | libc::MAP_POPULATE;
    #[cfg(not(target_os = "linux"))]
    let flags = libc::MAP_SHARED;
    // SAFETY: fd is an open shared-memory object of at least `len` bytes; we ask the kernel
    // for a fresh mapping and check the result before using it.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(CoreError::last_os(format!("mmap {name} ({len} bytes)")));
    }
    Ok(NonNull::new(p.cast::<u8>()).expect("mmap returned null"))
}

impl Segment {
    /// Creates a new segment of `len` bytes (zero-filled) whose name records `owner`.
    pub fn create(len: usize, owner: Identity) -> Result<Segment> {
        for _ in 0..16 {
            match Self::create_named(&new_name_for(owner), len) {
                Err(CoreError::Io { source, .. })
                    if source.raw_os_error() == Some(libc::EEXIST) =>
                {
                    continue
                }
                other => return other,
            }
        }
        Err(CoreError::Invalid(
            "could not find a free shared-memory name".into(),
        ))
    }

    /// Creates a new segment under exactly this name (it must not exist yet).
    pub fn create_named(name: &str, len: usize) -> Result<Segment> {
        if len == 0 {
            return Err(CoreError::Invalid(
                "a segment needs at least one byte".into(),
            ));
        }
        let cname = c_name(name)?;
        // SAFETY: valid C string; flags create a new object only.
        let fd = unsafe {
            libc::shm_open(
                cname.as_ptr(),
                libc::O_CREAT | libc::O_EXCL | libc::O_RDWR,
                0o600 as libc::mode_t,
            )
        };
        if fd < 0 {
            return Err(CoreError::last_os(format!("shm_open {name}")));
        }
        let made = Self::size_and_map(fd, len, name);
        // SAFETY: fd is ours; the mapping (if any) keeps the object alive.
        unsafe { libc::close(fd) };
        match made {
            Ok(ptr) => Ok(Segment {
                name: name.to_owned(),
                ptr,
                len,
                creator: Some(current_pid()),
                unlinked: AtomicBool::new(false),
            }),
            Err(e) => {
                // SAFETY: removes the name we just created; nothing else uses it yet.
                unsafe { libc::shm_unlink(cname.as_ptr()) };
                Err(e)
            }
        }
    }

    /// Hands the name's lifetime to someone else: dropping this handle will only unmap.
    pub fn forget_name(&self) {
        self.unlinked.store(true, Ordering::Release);
    }

    fn size_and_map(fd: libc::c_int, len: usize, name: &str) -> Result<NonNull<u8>> {
        // SAFETY: fd is an open, writable shared-memory object.
        if unsafe { libc::ftruncate(fd, len as libc::off_t) } != 0 {
            let err = std::io::Error::last_os_error();
            return Err(match err.raw_os_error() {
                Some(libc::ENOSPC) | Some(libc::EFBIG) | Some(libc::ENOMEM) => no_space(len as u64),
                _ => CoreError::Io {
                    context: format!("ftruncate {name} to {len} bytes"),
                    source: err,
                },
            });
        }
        #[cfg(target_os = "linux")]
        {
            // Commit the pages now: on tmpfs this fails with ENOSPC instead of a later SIGBUS.
            // SAFETY: fd is valid; the range lies within the size set above.
            let r = unsafe { libc::posix_fallocate(fd, 0, len as libc::off_t) };
            if r == libc::ENOSPC || r == libc::ENOMEM {
                return Err(no_space(len as u64));
            } else if r != 0 && r != libc::EOPNOTSUPP && r != libc::EINVAL {
                return Err(CoreError::Io {
                    context: format!("posix_fallocate {name} ({len} bytes)"),
                    source: std::io::Error::from_raw_os_error(r),
                });
            }
        }
        map(fd, len, name)
    }

    /// Maps an existing segment by name (from any process, whatever its start method).
    pub fn attach(name: &str) -> Result<Segment> {
        let cname = c_name(name)?;
        // SAFETY: valid C string; opens an existing object only.
        let fd = unsafe { libc::shm_open(cname.as_ptr(), libc::O_RDWR, 0) };
        if fd < 0 {
            let err = std::io::Error::last_os_error();
            let context = if err.raw_os_error() == Some(libc::ENOENT) {
                format!(
                    "shared-memory segment {name} is gone (its owner closed or unlinked it \
                     before this process attached)"
                )
            } else {
                format!("shm_open {name}")
            };
            return Err(CoreError::Io {
                context,
                source: err,
            });
        }
        // SAFETY: fd is open; fstat fills the zeroed struct we own.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        let len = if unsafe { libc::fstat(fd, &mut st) } == 0 {
            st.st_size as usize
        } else {
            0
        };
        let mapped = if len == 0 {
            Err(CoreError::BadSegment(format!("{name} has size 0")))
        } else {
            map(fd, len, name)
        };
        // SAFETY: fd is ours to close; the mapping stays valid after close.
        unsafe { libc::close(fd) };
        Ok(Segment {
            name: name.to_owned(),
            ptr: mapped?,
            len,
            creator: None,
            unlinked: AtomicBool::new(false),
        })
    }

    /// Removes the name so that no one else can attach; the memory lives on until every
    /// mapping is gone. Idempotent; a name already gone is not an error.
    pub fn unlink(&self) -> Result<()> {
        if self.unlinked.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        unlink_name(&self.name)
    }

    /// The segment's name, to pass to [`Segment::attach`] in another process.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a segment has at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Base address of the mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Whether this handle created the segment in this process (a forked child's copy did
    /// not).
    pub fn is_creator(&self) -> bool {
        self.creator == Some(current_pid())
    }

    /// Whether [`Segment::unlink`] was called through this handle.
    pub fn is_unlinked(&self) -> bool {
        self.unlinked.load(Ordering::Acquire)
    }
}

/// Unlinks a segment name; a name already gone is not an error.
pub fn unlink_name(name: &str) -> Result<()> {
    let cname = c_name(name)?;
    // SAFETY: valid C string.
    if unsafe { libc::shm_unlink(cname.as_ptr()) } != 0 {
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::ENOENT) {
            return Err(CoreError::Io {
                context: format!("shm_unlink {name}"),
                source: err,
            });
        }
    }
    Ok(())
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: ptr/len describe the mapping made in create/attach, unmapped exactly once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        if self.creator == Some(current_pid()) && !self.unlinked.load(Ordering::Acquire) {
            let _ = unlink_name(&self.name);
        }
    }
}

/// The owner encoded in a name of ours (segment or liveness token), if it is one.
pub fn owner_of(name: &str) -> Option<Identity> {
    let rest = name.trim_start_matches('/').strip_prefix(NAME_PREFIX)?;
    Identity::from_tag(rest.split('.').next()?)
}

/// Removes every name in `/dev/shm` owned by `owner` (segments and its token), if `owner` is
/// dead. Returns how many were removed.
pub fn sweep_owner(owner: Identity) -> usize {
    sweep(|id| id == owner)
}

/// Removes segments (and liveness tokens) left in `/dev/shm` by owners that are dead. An owner
/// is judged by its token ([`liveness`]), so live processes in other PID namespaces that share
/// `/dev/shm`, and names of older formats, are left alone. Returns how many were removed.
pub fn sweep_stale() -> usize {
    sweep(|_| true)
}

fn sweep(select: impl Fn(Identity) -> bool) -> usize {
    let Ok(dir) = std::fs::read_dir(liveness::SHM_DIR) else {
        return 0;
    };
    let mut verdicts: Vec<(Identity, bool)> = Vec::new();
    let mut tokens = Vec::new();
    let mut removed = 0;
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(id) = owner_of(name) else { continue };
        if !select(id) {
            continue;
        }
        let dead = match verdicts.iter().find(|(v, _)| *v == id) {
            Some(&(_, d)) => d,
            None => {
                let d = liveness::owner_dead(id);
                verdicts.push((id, d));
                d
            }
        };
        if !dead {
            continue;
        }
        if name.ends_with(".live") || name.ends_with(".tmp") {
            tokens.push(name.to_owned()); // last: a token gone first reads as dead anyway
        } else if unlink_name(&format!("/{name}")).is_ok() {
            removed += 1;
        }
    }
    for t in tokens {
        if unlink_name(&format!("/{t}")).is_ok() {
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exists(name: &str) -> bool {
        std::path::Path::new("/dev/shm")
            .join(name.trim_start_matches('/'))
            .exists()
    }

    #[test]
    fn create_attach_share_and_unlink_on_drop() {
        let me = liveness::me().unwrap();
        let a = Segment::create(4096, me).unwrap();
        assert!(owner_of(a.name()) == Some(me));
        // SAFETY: both mappings are 4096 bytes; test-only single-threaded access.
        unsafe { a.as_ptr().add(100).write(42) };
        let b = Segment::attach(a.name()).unwrap();
        assert_eq!(b.len(), 4096);
        assert_eq!(unsafe { b.as_ptr().add(100).read() }, 42);
        let name = a.name().to_owned();
        if cfg!(target_os = "linux") {
            assert!(exists(&name));
        }
        drop(b);
        drop(a);
        assert!(Segment::attach(&name).is_err());
    }

    #[test]
    fn explicit_unlink_keeps_memory_mapped() {
        let a = Segment::create(8192, liveness::me().unwrap()).unwrap();
        a.unlink().unwrap();
        a.unlink().unwrap();
        assert!(Segment::attach(a.name()).is_err());
        unsafe { a.as_ptr().add(8191).write(1) };
        assert_eq!(unsafe { a.as_ptr().add(8191).read() }, 1);
    }

    #[test]
    fn too_large_is_a_clear_error() {
        let err = Segment::create(1 << 50, liveness::me().unwrap()).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("/dev/shm"), "{msg}");
    }

    #[test]
    fn sweep_removes_segments_of_dead_owners_only() {
        let me = liveness::me().unwrap();
        let dead = Identity {
            pid: me.pid,
            nonce: me.nonce ^ 0x0f0f_0f0f,
        };
        let stale = Segment::create(4096, dead).unwrap();
        let live = Segment::create(4096, me).unwrap();
        // An old-format name whose owner cannot be vouched for is never swept.
        let old = Segment::create_named(&format!("/{NAME_PREFIX}{}.abcdef01", i32::MAX - 7), 4096)
            .unwrap();
        assert!(sweep_stale() >= 1);
        assert!(Segment::attach(stale.name()).is_err());
        assert!(Segment::attach(live.name()).is_ok());
        assert!(Segment::attach(old.name()).is_ok());
        assert!(liveness::alive(me), "our own token survives the sweep");
    }
}
