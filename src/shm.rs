//! Named POSIX shared-memory segments: create, attach by name, unlink, and unmap on drop.
//!
//! # Names
//! Every name is `/ec.<tag>.<16 hex digits>` (more parts may follow), where the last part is
//! 64 random bits from `getrandom` ([`crate::trust::random_u64`]) and the tag says whose
//! liveness the name lives by:
//! * a queue's names (its segment, its pooled slots, its one-shot segments) carry the queue's
//!   tag `q<64 random bits>` ([`crate::liveness::QueueToken`]): they stay while any process
//!   holds the queue's token, so a dead creator's messages stay readable until drained;
//! * other segments carry their owner process's tag `<pid>-<nonce>`
//!   ([`crate::liveness::Identity`]), and stay while it lives.
//!
//! Names that exist are listed by `ls /dev/shm`, so nothing relies on their secrecy; the random
//! part only keeps another user from taking a name *before* it exists. Pooled slot names add a
//! keyed hash of their own ([`crate::slots::slot_name`]). A name, once unlinked, is never
//! made again (a new segment always gets new random bits).
//!
//! # Trust
//! Segments are created with `O_CREAT | O_EXCL`, mode 0600, and opened with
//! `O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC` followed by an `fstat` check: anything that is not a
//! regular file of our uid with no group/other access is refused with
//! [`CoreError::BadSegment`] before a byte of it is mapped ([`crate::trust`]). So no process
//! ever maps, reads or unpickles what another user made, and no open ever blocks.
//!
//! # Lifetime rules
//! * The creating process owns the name: dropping its [`Segment`] unlinks it unless
//!   [`Segment::unlink`] (or [`Segment::forget_name`]) already did. A forked child holds a copy
//!   of the handle but never unlinks on drop (the pid check), so fork does not double-unlink.
//! * Everyone else only unmaps on drop.
//! * Callers unlink as soon as every party has attached; after that a SIGKILL of anyone leaks
//!   nothing, because the kernel frees the memory with the last mapping.
//! * Space is committed at creation (`posix_fallocate`), so a full `/dev/shm` is a clear
//!   [`CoreError::NoSpace`] at once, never a `SIGBUS` on first touch.
//!
//! # The sweep
//! What dead owners left is removed by [`crate::sweep`].

use crate::error::{CoreError, Result};
use crate::liveness::{self, Identity, QueueTag};
use crate::trust::{self, Opened};
use crate::wait::current_pid;
use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};

pub use crate::liveness::NAME_PREFIX;

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

/// Whose liveness a name lives by: the part between `ec.` and the next dot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Owner {
    /// A process (`<pid>-<nonce>`).
    Process(Identity),
    /// A queue (`q<16 hex digits>`).
    Queue(QueueTag),
}

/// A fresh name tagged `tag` (`<pid>-<nonce>` or `q<…>`), with 64 random bits.
pub fn new_name_tagged(tag: &str) -> Result<String> {
    let r = trust::random_u64().map_err(|e| CoreError::Io {
        context: "getrandom for a segment name".into(),
        source: e,
    })?;
    Ok(format!("/{NAME_PREFIX}{tag}.{r:016x}"))
}

/// A fresh, unguessable segment name owned by the process `owner`.
pub fn new_name_for(owner: Identity) -> Result<String> {
    new_name_tagged(&owner.tag())
}

/// A fresh, unguessable name with the same tag as `name` (a queue's one-shot segments share
/// the queue's tag).
pub fn new_name_like(name: &str) -> Result<String> {
    let tag = name
        .trim_start_matches('/')
        .strip_prefix(NAME_PREFIX)
        .and_then(|r| r.split('.').next())
        .filter(|t| !t.is_empty())
        .ok_or_else(|| CoreError::Invalid(format!("not a segment name of ours: {name:?}")))?;
    new_name_tagged(tag)
}

/// The path in `/dev/shm` of segment `name` (`/ec.…`): one component, no NUL, not `.`/`..`.
fn shm_path(name: &str) -> Result<CString> {
    let bare = name.strip_prefix('/').unwrap_or(name);
    if bare.is_empty() || bare == "." || bare == ".." || bare.contains('/') {
        return Err(CoreError::Invalid(format!("bad segment name {name:?}")));
    }
    trust::c_path(&format!("{}/{bare}", liveness::SHM_DIR))
        .map_err(|_| CoreError::Invalid(format!("bad segment name {name:?}")))
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

/// When a mapping's pages enter this process's page tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pages {
    /// All of them at once, as the mapping is made (`MAP_POPULATE`): for a segment that is
    /// about to be written or read whole (a large message), where faulting its pages one by
    /// one would cost more than the copy.
    Populated,
    /// Each on first touch: for a segment used a little at a time (a queue's ring), so that
    /// making it costs nothing per byte. Its space is committed either way
    /// (`posix_fallocate`): a touch never meets a full `/dev/shm`.
    OnTouch,
}

fn map(fd: libc::c_int, len: usize, name: &str, pages: Pages) -> Result<NonNull<u8>> {
    #[cfg(target_os = "linux")]
    let flags = match pages {
        Pages::Populated => libc::MAP_SHARED | libc::MAP_POPULATE,
        Pages::OnTouch => libc::MAP_SHARED,
    };
    #[cfg(not(target_os = "linux"))]
    let flags = {
        let _ = pages;
        libc::MAP_SHARED
    };
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
        Self::create_tagged(len, &owner.tag())
    }

    /// Creates a new segment of `len` bytes (zero-filled) under a fresh name tagged `tag`.
    pub fn create_tagged(len: usize, tag: &str) -> Result<Segment> {
        Self::create_tagged_with(len, tag, Pages::Populated)
    }

    /// [`Segment::create_tagged`], with its pages mapped as `pages` says.
    pub fn create_tagged_with(len: usize, tag: &str, pages: Pages) -> Result<Segment> {
        for _ in 0..16 {
            match Self::create_named_with(&new_name_tagged(tag)?, len, pages) {
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

    /// Creates a new segment under exactly this name (it must not exist yet: `O_EXCL`, 0600).
    pub fn create_named(name: &str, len: usize) -> Result<Segment> {
        Self::create_named_with(name, len, Pages::Populated)
    }

    /// [`Segment::create_named`], with its pages mapped as `pages` says.
    pub fn create_named_with(name: &str, len: usize, pages: Pages) -> Result<Segment> {
        if len == 0 {
            return Err(CoreError::Invalid(
                "a segment needs at least one byte".into(),
            ));
        }
        let path = shm_path(name)?;
        let fd = trust::create_own(&path).map_err(|e| CoreError::Io {
            context: format!("creating shared-memory segment {name}"),
            source: e,
        })?;
        let made = Self::size_and_map(fd.as_raw_fd(), len, name, pages);
        drop(fd); // the mapping (if any) keeps the object alive
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
                unsafe { libc::unlink(path.as_ptr()) };
                Err(e)
            }
        }
    }

    /// Hands the name's lifetime to someone else: dropping this handle will only unmap.
    pub fn forget_name(&self) {
        self.unlinked.store(true, Ordering::Release);
    }

    fn size_and_map(fd: libc::c_int, len: usize, name: &str, pages: Pages) -> Result<NonNull<u8>> {
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
        map(fd, len, name, pages)
    }

    /// Maps an existing segment by name (from any process, whatever its start method). Only a
    /// regular file of our uid with mode 0600 (or narrower) is mapped: anything else under the
    /// name (another user's file, a link, a FIFO, a directory) is [`CoreError::BadSegment`],
    /// and nothing blocks.
    pub fn attach(name: &str) -> Result<Segment> {
        Self::attach_with(name, Pages::Populated)
    }

    /// [`Segment::attach`], with its pages mapped as `pages` says.
    pub fn attach_with(name: &str, pages: Pages) -> Result<Segment> {
        let path = shm_path(name)?;
        let (fd, st) = match trust::open_own(&path, libc::O_RDWR) {
            Opened::Ours(fd, st) => (fd, st),
            Opened::Missing => {
                return Err(CoreError::Io {
                    context: format!(
                        "shared-memory segment {name} is gone (its owner closed or unlinked \
                         it before this process attached)"
                    ),
                    source: std::io::Error::from_raw_os_error(libc::ENOENT),
                })
            }
            Opened::NotOurs(why) => {
                return Err(CoreError::BadSegment(format!(
                    "{name} is {why}; refusing to map it (another user may have put it there)"
                )))
            }
            Opened::Failed(e) => {
                return Err(CoreError::Io {
                    context: format!("opening shared-memory segment {name}"),
                    source: e,
                })
            }
        };
        let len = st.st_size.max(0) as usize;
        if len == 0 {
            return Err(CoreError::BadSegment(format!("{name} has size 0")));
        }
        let ptr = map(fd.as_raw_fd(), len, name, pages)?;
        drop(fd); // the mapping stays valid after close
        Ok(Segment {
            name: name.to_owned(),
            ptr,
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
    let path = shm_path(name)?;
    // SAFETY: valid C string.
    if unsafe { libc::unlink(path.as_ptr()) } != 0 {
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::ENOENT) {
            return Err(CoreError::Io {
                context: format!("unlink {name}"),
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

/// The owner encoded in a name of ours (segment or token), if it is one.
pub fn owner_of(name: &str) -> Option<Owner> {
    let rest = name.trim_start_matches('/').strip_prefix(NAME_PREFIX)?;
    let tag = rest.split('.').next()?;
    if let Some(q) = QueueTag::from_tag(tag) {
        return Some(Owner::Queue(q));
    }
    Identity::from_tag(tag).map(Owner::Process)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn exists(name: &str) -> bool {
        std::path::Path::new("/dev/shm")
            .join(name.trim_start_matches('/'))
            .exists()
    }

    #[test]
    fn create_attach_share_and_unlink_on_drop() {
        let me = liveness::me().unwrap();
        let a = Segment::create(4096, me).unwrap();
        assert!(owner_of(a.name()) == Some(Owner::Process(me)));
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

    pub(crate) fn plant(name: &str, how: &str) {
        use std::os::unix::fs::PermissionsExt;
        let path = format!("/dev/shm/{}", name.trim_start_matches('/'));
        match how {
            "fifo" => {
                let c = trust::c_path(&path).unwrap();
                // SAFETY: valid C string.
                assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
            }
            "link" => std::os::unix::fs::symlink("/etc/passwd", &path).unwrap(),
            "dir" => std::fs::create_dir(&path).unwrap(),
            "0666" | "foreign" => {
                std::fs::write(&path, vec![7u8; 8192]).unwrap();
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
                if how == "foreign" {
                    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
                        .unwrap();
                    std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
                }
            }
            _ => unreachable!(),
        }
    }

    pub(crate) fn remove(name: &str) {
        let path = format!("/dev/shm/{}", name.trim_start_matches('/'));
        let _ = std::fs::remove_file(&path).or_else(|_| std::fs::remove_dir(&path));
    }

    #[test]
    fn attach_refuses_what_we_did_not_make_and_never_blocks() {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        for how in ["fifo", "link", "dir", "0666", "foreign"] {
            if how == "foreign" && !root {
                continue; // only root can hand a file to another uid
            }
            let name = new_name_for(liveness::me().unwrap()).unwrap();
            plant(&name, how);
            let err = Segment::attach(&name).unwrap_err();
            assert!(matches!(err, CoreError::BadSegment(_)), "{how}: {err}");
            assert!(err.to_string().contains("refusing"), "{how}: {err}");
            // Creating over it is refused too (O_EXCL): never someone else's bytes.
            assert!(Segment::create_named(&name, 4096).is_err(), "{how}");
            remove(&name);
        }
    }

    #[test]
    fn names_carry_64_random_bits_and_segments_are_0600() {
        use std::os::unix::fs::MetadataExt;
        let me = liveness::me().unwrap();
        let a = Segment::create(4096, me).unwrap();
        let b = Segment::create(4096, me).unwrap();
        let suffix = |n: &str| n.rsplit('.').next().unwrap().to_owned();
        assert_eq!(suffix(a.name()).len(), 16, "{}", a.name());
        assert_ne!(suffix(a.name()), suffix(b.name()));
        let m = std::fs::metadata(format!("/dev/shm{}", a.name())).unwrap();
        assert_eq!(m.mode() & 0o777, 0o600);
        let like = new_name_like("/ec.q0123456789abcdef.0011223344556677").unwrap();
        assert!(like.starts_with("/ec.q0123456789abcdef."), "{like}");
        assert_eq!(
            owner_of(&like),
            Some(Owner::Queue(QueueTag(0x0123_4567_89ab_cdef)))
        );
        assert!(shm_path("/ec.a/b").is_err() && shm_path("/..").is_err());
    }

    #[test]
    fn a_queue_that_cannot_be_made_or_attached_leaves_no_token() {
        fn q_tokens() -> std::collections::HashSet<String> {
            std::fs::read_dir("/dev/shm")
                .unwrap()
                .flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.starts_with("ec.q") && n.ends_with(".live"))
                .collect()
        }
        let before = q_tokens();
        let cfg = crate::queue::QueueConfig {
            ring_bytes: 1 << 39, // more than any /dev/shm: NoSpace after the token was made
            ..Default::default()
        };
        assert!(crate::queue::Queue::create(&cfg).is_err());
        // A queue name whose segment is gone (its token still held by nobody else).
        let q = crate::queue::Queue::create(&crate::queue::QueueConfig {
            ring_bytes: 4096,
            ..Default::default()
        })
        .unwrap();
        let name = q.name().to_owned();
        q.unlink().unwrap();
        drop(q);
        assert!(crate::queue::Queue::attach(&name).is_err());
        let orphans: Vec<String> = q_tokens()
            .difference(&before)
            .filter(|t| {
                let tag = t.trim_start_matches(NAME_PREFIX).trim_end_matches(".live");
                QueueTag::from_tag(tag).is_some_and(|t| liveness::LastHold::take(t).is_some())
            })
            .cloned()
            .collect();
        assert!(orphans.is_empty(), "unheld queue tokens left: {orphans:?}");
    }
}
