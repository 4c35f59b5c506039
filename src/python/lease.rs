//! `easycore._core.ShmLease`: a pooled slot leased by this process (`Queue.lease`), exposed as
//! a writable buffer that numpy arrays and tensors are built on, and the registry that lets
//! `Queue.put` recognise a message part lying in a leased slot and send it by reference.
//!
//! A lease is *held* until it is sent or dropped: dropping it unsent gives the slot back to the
//! pool; sending it (by a `put` whose part lies inside it) hands the slot to the ring and
//! disarms the lease, after which its buffer is exported read-only. One lease is sent at most
//! once: a part lying in a lease already sent (or a second part in the same lease) is copied.

use crate::queue::{RefEntry, WriterSlot};
use crate::shm::Segment;
use crate::slots::Lease;
use pyo3::ffi;
use pyo3::prelude::*;
use std::os::raw::c_int;
use std::sync::{Arc, Mutex, Weak};

/// The shared part of a lease: the registry holds it weakly.
pub(crate) struct LeaseInner {
    /// The slot's mapping in this process (outlives the lease: views of a sent lease stay
    /// mapped, read-only for new exports).
    seg: Arc<Segment>,
    /// Bytes handed out (at most the segment's length).
    len: usize,
    /// The queue the slot belongs to (its segment name).
    queue: String,
    idx: usize,
    gen: u64,
    /// `Some` while held; taken (and disarmed) when sent.
    lease: Mutex<Option<Lease>>,
}

impl Drop for LeaseInner {
    fn drop(&mut self) {
        crate::forkviews::unregister_leased(self.seg.as_ptr());
    }
}

/// Every lease of this process that may still be sent.
static LEASES: Mutex<Vec<Weak<LeaseInner>>> = Mutex::new(Vec::new());

fn registry() -> std::sync::MutexGuard<'static, Vec<Weak<LeaseInner>>> {
    LEASES.lock().unwrap_or_else(|p| p.into_inner())
}

/// A part of a message that lies in a held lease of queue `queue`.
pub(crate) struct Matched {
    pub part: usize,
    pub entry: RefEntry,
    inner: Arc<LeaseInner>,
}

impl Matched {
    /// The message was put: the ring holds the slot now.
    pub(crate) fn sent(self) {
        let lease = self
            .inner
            .lease
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(l) = lease {
            l.disarm();
        }
    }
}

/// The parts of a message (their bytes) that can travel by reference in `queue`: each lies in
/// a lease this process holds on it, one part per lease, the first such part of each lease,
/// never part 0.
/// Parts shorter than `min` are not looked up (copying them costs less).
pub(crate) fn match_parts(queue: &str, parts: &[&[u8]], min: usize) -> Vec<Matched> {
    if !parts.iter().skip(1).any(|p| p.len() >= min.max(1)) {
        return Vec::new();
    }
    let mut reg = registry();
    reg.retain(|w| w.strong_count() > 0);
    let mut out: Vec<Matched> = Vec::new();
    for (i, p) in parts.iter().enumerate() {
        // Part 0 always arrives as `bytes` (the pickle stream): it is never sent by reference.
        if i == 0 || p.len() < min.max(1) || out.len() >= crate::queue::MAX_REFS {
            continue;
        }
        let start = p.as_ptr() as usize;
        let end = start + p.len();
        for w in reg.iter() {
            let Some(inner) = w.upgrade() else { continue };
            let base = inner.seg.as_ptr() as usize;
            if inner.queue != queue
                || start < base
                || end > base + inner.len
                || out.iter().any(|m| Arc::ptr_eq(&m.inner, &inner))
            {
                continue;
            }
            let held = inner
                .lease
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_some();
            if held {
                out.push(Matched {
                    part: i,
                    entry: RefEntry {
                        part: i as u32,
                        slot: inner.idx as u32,
                        gen: inner.gen,
                        offset: (start - base) as u64,
                        len: p.len() as u64,
                    },
                    inner,
                });
                break;
            }
        }
    }
    out
}

/// Memory leased from a queue's pool of shared segments, to build a result in: when a part
/// of a message put on that queue lies inside it, the part travels by reference (no copy).
#[pyclass(module = "easycore._core", frozen, weakref)]
pub struct ShmLease {
    inner: Arc<LeaseInner>,
}

impl ShmLease {
    pub(crate) fn new(queue: &str, len: usize, w: WriterSlot) -> Self {
        let (idx, gen) = w.lease.slot();
        // A forked child gets a private copy of the slot (crate::forkviews): its array keeps
        // its bytes when the parent's slot is reused, and its writes stay its own.
        crate::forkviews::register_leased(w.seg.as_ptr(), w.seg.len());
        let inner = Arc::new(LeaseInner {
            seg: w.seg,
            len,
            queue: queue.to_owned(),
            idx,
            gen,
            lease: Mutex::new(Some(w.lease)),
        });
        let mut reg = registry();
        reg.retain(|w| w.strong_count() > 0);
        reg.push(Arc::downgrade(&inner));
        ShmLease { inner }
    }
}

#[pymethods]
impl ShmLease {
    fn __len__(&self) -> usize {
        self.inner.len
    }

    fn __repr__(&self) -> String {
        format!(
            "<ShmLease {} bytes{}>",
            self.inner.len,
            if self.sent() { " sent" } else { "" }
        )
    }

    /// Whether the slot was sent by reference (the lease then no longer holds it, and new
    /// buffer exports are read-only).
    #[getter]
    fn sent(&self) -> bool {
        self.inner
            .lease
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none()
    }

    /// Exposes the bytes (C-contiguous, format "B"; writable until sent).
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let me = slf.get();
        let readonly = c_int::from(me.sent());
        // SAFETY: `len` bytes lie inside the mapping (the slot is at least as large, checked
        // when it was mapped), which lives as long as `slf`; PyBuffer_FillInfo stores a new
        // reference to `slf` in the view (and refuses a writable view when `readonly`).
        let r = unsafe {
            ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                me.inner.seg.as_ptr().cast(),
                me.inner.len as ffi::Py_ssize_t,
                readonly,
                flags,
            )
        };
        if r != 0 {
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}
