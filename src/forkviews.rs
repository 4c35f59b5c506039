//! Zero-copy views across `fork`: a forked child keeps what it inherited.
//!
//! A reader's zero-copy view of a large message is a window onto a pooled shared segment
//! (`crate::slots`). When the reader drops its last view, the segment goes back to the pool
//! and the next large message overwrites it. A forked child shares the parent's mapping, so
//! without care an array it inherited would change under it once the parent lets go.
//!
//! So, just before every `fork` (a `pthread_atfork` prepare handler, in the forking thread),
//! each live view's mapping is made private to the parent: its bytes are copied into fresh
//! anonymous memory that replaces the mapping at the same address (`mremap`), so every pointer
//! into it stays valid. The fork then gives the child a copy-on-write image of that private
//! memory, and neither process's views can change behind its back. The pooled segment itself
//! is no longer mapped there; [`epoch`] is bumped so that queue handles map slot segments
//! afresh instead of using the replaced mapping. Dropping the views later unmaps the private
//! copy and frees the slot as usual.
//!
//! A writer's *leased* slot (an `easycore.shm` array or a `ShmLease` the process fills in
//! place, `queue::byref`) is the other way round: the parent goes on writing into the shared
//! segment and sends it, so its mapping must stay shared in the parent. There, the prepare
//! handler copies the lease into fresh anonymous memory, and the *child* handler moves that
//! copy over its inherited mapping (before any other code of the child runs; the parent
//! unmaps its copy): the child's array keeps the bytes it had at the fork, its writes never
//! reach the parent's slot (nor the next message once the slot is reused), and the parent's
//! later writes never reach the child.
//!
//! Costs and limits: the copy is made only for views alive at the moment of the fork, once per
//! view (for leases, once per fork in each child). A write made into such a view by another thread *during* the fork (numpy releases the
//! GIL) may be lost in the parent.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Once;

/// One mapping that zero-copy views use: base address, length, and whether it is private
/// already.
struct View {
    addr: usize,
    len: usize,
    count: usize,
    private: bool,
    /// A writer's lease: made private in the child after a fork, never in the parent.
    leased: bool,
    /// A lease's copy made just before a fork (0: none): it becomes the child's mapping, and
    /// the parent unmaps it.
    snapshot: usize,
}

/// A spin-locked list (a `Mutex` could be left locked in the child by another thread).
struct Registry {
    locked: AtomicBool,
    views: UnsafeCell<Vec<View>>,
}

// SAFETY: `views` is only touched with `locked` held (acquire/release), or in the forked
// child's handler, where no other thread exists.
unsafe impl Sync for Registry {}

static REGISTRY: Registry = Registry {
    locked: AtomicBool::new(false),
    views: UnsafeCell::new(Vec::new()),
};
static EPOCH: AtomicU64 = AtomicU64::new(0);
static HOOKS: Once = Once::new();

fn with<R>(f: impl FnOnce(&mut Vec<View>) -> R) -> R {
    while REGISTRY
        .locked
        .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        std::hint::spin_loop();
    }
    // SAFETY: we hold the spin lock.
    let out = f(unsafe { &mut *REGISTRY.views.get() });
    REGISTRY.locked.store(false, Ordering::Release);
    out
}

/// Bumped whenever mappings were replaced by private copies: a cached mapping of an older
/// epoch must not be used to reach the shared segment.
pub fn epoch() -> u64 {
    EPOCH.load(Ordering::Acquire)
}

/// A mapping at `addr` (of `len` bytes) is used by a zero-copy view from now on.
pub fn register(addr: *mut u8, len: usize) {
    add(addr, len, false);
}

/// A mapping at `addr` (of `len` bytes) is a writer's leased slot from now on: a forked child
/// gets a private copy of it.
pub fn register_leased(addr: *mut u8, len: usize) {
    add(addr, len, true);
}

fn add(addr: *mut u8, len: usize, leased: bool) {
    HOOKS.call_once(|| {
        // SAFETY: registers plain extern "C" functions without captured state.
        unsafe { libc::pthread_atfork(Some(before_fork), Some(in_parent), Some(in_child)) };
    });
    let addr = addr as usize;
    with(
        |v| match v.iter_mut().find(|e| e.addr == addr && e.leased == leased) {
            Some(e) => e.count += 1,
            None => v.push(View {
                addr,
                len,
                count: 1,
                private: false,
                leased,
                snapshot: 0,
            }),
        },
    );
}

/// A view of the mapping at `addr` is gone.
pub fn unregister(addr: *mut u8) {
    remove(addr, false);
}

/// A lease of the mapping at `addr` is gone.
pub fn unregister_leased(addr: *mut u8) {
    remove(addr, true);
}

fn remove(addr: *mut u8, leased: bool) {
    let addr = addr as usize;
    with(|v| {
        if let Some(i) = v.iter().position(|e| e.addr == addr && e.leased == leased) {
            v[i].count -= 1;
            if v[i].count == 0 {
                v.swap_remove(i);
            }
        }
    });
}

/// A private anonymous copy of `len` bytes at `addr`; its address, or `None`.
fn copy_of(addr: usize, len: usize) -> Option<usize> {
    // SAFETY: `addr..addr+len` is a live mapping of ours (registered by a view or a lease
    // that holds it); the new anonymous mapping is ours.
    unsafe {
        let tmp = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if tmp == libc::MAP_FAILED {
            return None;
        }
        std::ptr::copy_nonoverlapping(addr as *const u8, tmp.cast::<u8>(), len);
        Some(tmp as usize)
    }
}

/// Moves the private mapping at `tmp` over the mapping at `addr` (same length): the range is
/// mapped at every instant. Unmaps `tmp` if that fails.
fn put_over(tmp: usize, addr: usize, len: usize) -> bool {
    // SAFETY: `tmp` is our anonymous mapping of `len` bytes, `addr..addr+len` a live mapping
    // of ours; mremap with MREMAP_FIXED atomically replaces the latter with the former.
    unsafe {
        let r = libc::mremap(
            tmp as *mut libc::c_void,
            len,
            len,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            addr as *mut libc::c_void,
        );
        if r == libc::MAP_FAILED {
            libc::munmap(tmp as *mut libc::c_void, len);
            return false;
        }
        true
    }
}

/// Replaces the mapping at `addr` with a private copy of its bytes, at the same address.
fn privatize(addr: usize, len: usize) -> bool {
    copy_of(addr, len).is_some_and(|tmp| put_over(tmp, addr, len))
}

fn lock() {
    while REGISTRY
        .locked
        .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        std::hint::spin_loop();
    }
}

/// Prepare handler: takes the registry's lock and keeps it across the fork, so that the
/// child's copy of the list is never one another thread was changing. Views are made private
/// here (in the parent); leases are copied, and the copy becomes the child's mapping: a
/// snapshot as of the fork, which the parent's later writes cannot reach (a copy made in the
/// child would race with them).
extern "C" fn before_fork() {
    lock();
    // SAFETY: we hold the spin lock (until `in_parent` / `in_child`).
    let v = unsafe { &mut *REGISTRY.views.get() };
    let mut any = false;
    for e in v.iter_mut().filter(|e| !e.private) {
        if e.leased {
            e.snapshot = copy_of(e.addr, e.len).unwrap_or(0);
        } else {
            e.private = privatize(e.addr, e.len);
            any |= e.private;
        }
    }
    if any {
        EPOCH.fetch_add(1, Ordering::AcqRel);
    }
}

extern "C" fn in_parent() {
    // SAFETY: we hold the spin lock (taken by `before_fork`).
    let v = unsafe { &mut *REGISTRY.views.get() };
    for e in v.iter_mut().filter(|e| e.snapshot != 0) {
        // SAFETY: the snapshot is our anonymous mapping of `len` bytes, used by no one.
        unsafe { libc::munmap(e.snapshot as *mut libc::c_void, e.len) };
        e.snapshot = 0;
    }
    REGISTRY.locked.store(false, Ordering::Release);
}

extern "C" fn in_child() {
    // SAFETY: the prepare handler took the lock before the fork, and the child is
    // single-threaded: the list is ours and consistent.
    let views = unsafe { &mut *REGISTRY.views.get() };
    let mut any = false;
    for e in views.iter_mut().filter(|e| e.snapshot != 0) {
        e.private = put_over(e.snapshot, e.addr, e.len);
        e.snapshot = 0;
        any |= e.private;
    }
    if any {
        EPOCH.fetch_add(1, Ordering::AcqRel);
    }
    REGISTRY.locked.store(false, Ordering::Release);
}
