//! `easycore._core.Queue`: the shared-memory queue for Python.
//!
//! Messages are `(seq, kind, parts)`. `put` borrows the parts' bytes through the buffer
//! protocol and copies them once, into shared memory. `get` hands back part 0 as `bytes` and the
//! other parts as writable buffers: a `bytearray` (one copy out of the ring) or, for messages
//! that travelled in their own side segment, a zero-copy `ShmBuffer`.
//! Small copies happen with the GIL held (cheaper than releasing it); waits and large copies
//! happen with the GIL released, in ticks of at most 100 ms between signal checks. `get` of a
//! small message (the common case) copies it out and frees its record under one hold of the
//! queue lock; a `put` of one `bytes` object skips the buffer protocol and allocates nothing.

use super::buffers::{BorrowedParts, ShmBuffer};
use super::detach::detach;
use super::errors::{make, to_py, IntoPy};
use super::lease::{match_parts, Matched, ShmLease};
use super::{check_timeout, deadline, expired, tick};
use crate::error::CoreError;
use crate::queue::{Claimed, Queue, QueueConfig, Small, Waited};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Copies up to this many bytes with the GIL held; larger ones release it.
const GIL_COPY_LIMIT: usize = 64 << 10;
/// Parts shorter than this are never looked up among the leases (copying them is cheaper).
const REF_MIN: usize = 4096;
/// `get` copies messages with at most this many bytes of body under one lock hold
/// ([`Queue::take_small`]); a memcpy this short costs less than a second lock round trip.
const TAKE_SMALL_LIMIT: u64 = 8 << 10;

/// A bounded multi-process message queue in shared memory.
#[pyclass(module = "easycore._core", name = "Queue", frozen)]
pub struct PyQueue {
    q: Queue,
    /// Messages this handle took from the queue but could not hand to Python (building the
    /// objects failed: MemoryError): served first by the next `get`/`get_many`, so that a
    /// failed call loses nothing. Claims here stay claimed (their records READING).
    pending: Mutex<VecDeque<Pending>>,
    /// Whether `pending` may hold something (checked without the mutex on every get).
    has_pending: AtomicBool,
}

/// A message taken but not yet handed out.
enum Pending {
    /// Built, released: the `(seq, kind, parts)` tuple itself.
    Ready(Py<PyTuple>),
    /// Copied out and released (`take_small`): its parts as Python objects.
    Built(u64, u32, Vec<Py<PyAny>>),
    /// Still claimed.
    Claims(Vec<Claimed>),
}

/// `e` as a Python exception with a `count` attribute: how many messages of the call were
/// put before it failed (so a retry does not put them twice).
fn counted(py: Python<'_>, e: CoreError, done: usize) -> PyErr {
    match e {
        CoreError::Partial { done: n, source } => with_count(py, to_py(py, *source), done + n),
        e => with_count(py, to_py(py, e), done),
    }
}

fn with_count(py: Python<'_>, e: PyErr, done: usize) -> PyErr {
    let _ = e.value(py).setattr("count", done);
    e
}

/// Pending copies out of shared memory, done after the GIL is released.
struct Copies(Vec<(*const u8, *mut u8, usize)>);

// SAFETY: each source lies in a claimed record or side segment that stays claimed until the
// copies finish; each destination is a freshly allocated bytearray no other thread has seen
// yet. The pointers are used only inside the `detach` closure, before the claims are released.
unsafe impl Send for Copies {}

struct ClaimGuard<'a> {
    q: &'a Queue,
    claims: Vec<Claimed>,
}

impl Drop for ClaimGuard<'_> {
    fn drop(&mut self) {
        self.q.release(&mut self.claims);
    }
}

fn split_parts<'py>(parts: &Bound<'py, PyAny>) -> PyResult<Vec<Bound<'py, PyAny>>> {
    if parts.is_instance_of::<PyList>() || parts.is_instance_of::<PyTuple>() {
        parts.try_iter()?.collect()
    } else {
        Ok(vec![parts.clone()])
    }
}

fn new_bytes(py: Python<'_>, src: *const u8, len: usize) -> PyResult<Bound<'_, PyAny>> {
    // SAFETY: `src` points at `len` readable bytes of a held claim; CPython copies them into a
    // new bytes object (a new reference, checked for NULL).
    unsafe {
        let p = ffi::PyBytes_FromStringAndSize(src.cast(), len as ffi::Py_ssize_t);
        Bound::from_owned_ptr_or_err(py, p)
    }
}

fn new_bytearray(py: Python<'_>, src: *const u8, len: usize) -> PyResult<Bound<'_, PyAny>> {
    // SAFETY: as in `new_bytes`, copying into a new bytearray.
    unsafe {
        let p = ffi::PyByteArray_FromStringAndSize(src.cast(), len as ffi::Py_ssize_t);
        Bound::from_owned_ptr_or_err(py, p)
    }
}

/// A new list of `items`, or the error (MemoryError) if it cannot be made: allocations are
/// checked, never a panic.
fn new_list<'py, T>(py: Python<'py>, items: &[Bound<'py, T>]) -> PyResult<Bound<'py, PyList>> {
    // SAFETY: PyList_New returns a new reference or NULL (checked); PyList_SetItem steals the
    // new reference it is given, into a slot of a list nobody else has seen yet.
    unsafe {
        let list =
            Bound::from_owned_ptr_or_err(py, ffi::PyList_New(items.len() as ffi::Py_ssize_t))?;
        for (i, it) in items.iter().enumerate() {
            ffi::PyList_SetItem(list.as_ptr(), i as ffi::Py_ssize_t, it.clone().into_ptr());
        }
        Ok(list.cast_into_unchecked())
    }
}

/// A message as Python sees it: `(seq, kind, [parts])`. Every allocation is checked (a
/// MemoryError, never a panic), so a caller can keep the message when it fails.
fn message<'py>(
    py: Python<'py>,
    seq: u64,
    kind: u32,
    parts: &[Bound<'py, PyAny>],
) -> PyResult<Bound<'py, PyTuple>> {
    // SAFETY: each constructor returns a new reference or NULL (checked); PyTuple_SetItem
    // steals the new reference it is given, into a slot of a tuple nobody else has seen yet.
    unsafe {
        let seq = Bound::from_owned_ptr_or_err(py, ffi::PyLong_FromUnsignedLongLong(seq))?;
        let kind = Bound::from_owned_ptr_or_err(
            py,
            ffi::PyLong_FromUnsignedLong(std::os::raw::c_ulong::from(kind)),
        )?;
        let list = new_list(py, parts)?;
        let t = Bound::from_owned_ptr_or_err(py, ffi::PyTuple_New(3))?;
        ffi::PyTuple_SetItem(t.as_ptr(), 0, seq.into_ptr());
        ffi::PyTuple_SetItem(t.as_ptr(), 1, kind.into_ptr());
        ffi::PyTuple_SetItem(t.as_ptr(), 2, list.into_any().into_ptr());
        Ok(t.cast_into_unchecked())
    }
}

impl PyQueue {
    fn over(q: Queue) -> Self {
        PyQueue {
            q,
            pending: Mutex::new(VecDeque::new()),
            has_pending: AtomicBool::new(false),
        }
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, VecDeque<Pending>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Puts messages that could not be handed out back in front of the pending ones.
    fn stash_front(&self, p: Pending) {
        self.pending().push_front(p);
        self.has_pending.store(true, Ordering::Release);
    }

    /// Up to `max` messages taken earlier but not handed out (see `pending`), oldest first;
    /// `None` when there are none. On an error, whatever was built is kept for next time.
    fn take_pending<'py>(
        &self,
        py: Python<'py>,
        max: usize,
    ) -> PyResult<Option<Vec<Bound<'py, PyTuple>>>> {
        if !self.has_pending.load(Ordering::Acquire) {
            return Ok(None);
        }
        let mut out: Vec<Bound<'py, PyTuple>> = Vec::new();
        while out.len() < max {
            let next = {
                let mut g = self.pending();
                let n = g.pop_front();
                if g.is_empty() {
                    self.has_pending.store(false, Ordering::Release);
                }
                n
            };
            let got = match next {
                None => break,
                Some(Pending::Ready(t)) => Ok(vec![t.into_bound(py)]),
                Some(Pending::Built(seq, kind, objs)) => {
                    let bound: Vec<_> = objs.iter().map(|o| o.bind(py).clone()).collect();
                    message(py, seq, kind, &bound)
                        .map(|m| vec![m])
                        .inspect_err(|_| {
                            self.stash_front(Pending::Built(seq, kind, objs));
                        })
                }
                Some(Pending::Claims(mut claims)) => {
                    let want = max - out.len();
                    if claims.len() > want {
                        let rest = claims.split_off(want);
                        self.stash_front(Pending::Claims(rest));
                    }
                    self.materialize(py, claims) // re-stashes them on an error
                }
            };
            match got {
                Ok(m) => out.extend(m),
                Err(e) => {
                    self.stash_ready(out);
                    return Err(e);
                }
            }
        }
        Ok((!out.is_empty()).then_some(out))
    }

    /// Keeps built messages, in order, in front of the pending ones.
    fn stash_ready(&self, msgs: Vec<Bound<'_, PyTuple>>) {
        for m in msgs.into_iter().rev() {
            self.stash_front(Pending::Ready(m.unbind()));
        }
    }

    /// The list `get_many` returns; if even that cannot be made, the messages are kept.
    fn list_of<'py>(
        &self,
        py: Python<'py>,
        msgs: Vec<Bound<'py, PyTuple>>,
    ) -> PyResult<Bound<'py, PyList>> {
        new_list(py, &msgs).inspect_err(|_| self.stash_ready(msgs.clone()))
    }

    fn put_all(
        &self,
        py: Python<'_>,
        msgs: &[(u64, u32, &[&[u8]])],
        total: usize,
        block: bool,
        timeout: Option<f64>,
    ) -> PyResult<usize> {
        check_timeout(timeout)?;
        let mut done = 0;
        if total <= GIL_COPY_LIMIT {
            // Small: copy with the GIL held (only *trying* the lock: a holder that is slow,
            // stopped or dead is waited for below, with the GIL released), and read the clock
            // only if we must wait.
            match self.q.try_put_many(msgs) {
                Ok(n) => done = n,
                Err(CoreError::Busy { .. }) => {}
                Err(e) => return Err(counted(py, e, 0)),
            }
            if done == msgs.len() {
                return Ok(done);
            }
        }
        let deadline = deadline(block, timeout)?;
        loop {
            let t = tick(deadline);
            let rest = &msgs[done..];
            match detach(py, || self.q.put_many(rest, Some(t))) {
                Ok(n) => done += n,
                Err(CoreError::Full) => {}
                Err(CoreError::Partial { done: n, source }) => {
                    break Err(counted(py, *source, done + n));
                }
                Err(e) => break Err(counted(py, e, done)),
            }
            if done == msgs.len() {
                break Ok(done);
            }
            if expired(deadline) {
                let e = make(
                    py,
                    "QueueFull",
                    format!(
                        "the queue is full: {done} of {} messages were put before the timeout",
                        msgs.len()
                    ),
                );
                break Err(with_count(py, e, done));
            }
            if let Err(e) = py.check_signals() {
                break Err(with_count(py, e, done));
            }
        }
    }

    /// Puts one message whose `matched` parts lie in leases of this queue: those travel by
    /// reference; the rest of the message is copied as usual.
    #[allow(clippy::too_many_arguments)]
    fn put_by_ref(
        &self,
        py: Python<'_>,
        seq: u64,
        kind: u32,
        slices: &[&[u8]],
        matched: Vec<Matched>,
        block: bool,
        timeout: Option<f64>,
    ) -> PyResult<bool> {
        let mut parts = slices.to_vec();
        for m in &matched {
            parts[m.part] = &[];
        }
        let refs: Vec<_> = matched.iter().map(|m| m.entry).collect();
        let deadline = deadline(block, timeout)?;
        let result = loop {
            let t = tick(deadline);
            match detach(py, || self.q.put_refs(seq, kind, &parts, &refs, Some(t))) {
                Ok(()) => break Ok(true),
                Err(CoreError::Full) => {}
                Err(CoreError::Invalid(_)) => break Ok(false),
                Err(e) => break Err(counted(py, e, 0)),
            }
            if expired(deadline) {
                let e = make(py, "QueueFull", "the queue is full".to_string());
                break Err(with_count(py, e, 0));
            }
            if let Err(e) = py.check_signals() {
                break Err(with_count(py, e, 0));
            }
        };
        if result.as_ref().is_ok_and(|&sent| sent) {
            for m in matched {
                m.sent();
            }
        }
        result
    }

    fn claim(
        &self,
        py: Python<'_>,
        max: usize,
        deadline: Option<Instant>,
    ) -> PyResult<Vec<Claimed>> {
        // With the GIL held, only a look that cannot wait (the lock is only tried).
        match self.q.claim(max, Some(Instant::now())) {
            Ok(c) => return Ok(c),
            Err(CoreError::Empty | CoreError::Busy { .. }) if !expired(deadline) => {}
            Err(CoreError::Busy { .. }) => return Err(to_py(py, CoreError::Empty)),
            Err(e) => return Err(to_py(py, e)),
        }
        loop {
            let t = tick(deadline);
            match detach(py, || self.q.claim(max, Some(t))) {
                Ok(c) => break Ok(c),
                Err(CoreError::Empty | CoreError::Busy { .. }) => {}
                Err(e) => break Err(to_py(py, e)),
            }
            if expired(deadline) {
                break Err(to_py(py, CoreError::Empty));
            }
            if let Err(e) = py.check_signals() {
                break Err(e);
            }
        }
    }

    /// The fast path of `get`: copies the next message out and releases it under one lock
    /// hold, when it is small and inline. Only `bytes`/`bytearray` objects are made under the
    /// lock: they are not tracked by the garbage collector, so making them runs no Python code
    /// that could come back to this queue.
    fn take_small<'py>(&self, py: Python<'py>) -> PyResult<Small<Bound<'py, PyTuple>>> {
        let taken = self.q.take_small(TAKE_SMALL_LIMIT, |seq, kind, parts| {
            let mut objs = Vec::with_capacity(parts.len());
            for (i, p) in parts.iter().enumerate() {
                objs.push(if i == 0 {
                    new_bytes(py, p.as_ptr(), p.len())?
                } else {
                    new_bytearray(py, p.as_ptr(), p.len())?
                });
            }
            Ok::<_, PyErr>((seq, kind, objs))
        });
        Ok(match taken.map_err(|e| to_py(py, e))? {
            Small::Took(r) => {
                let (seq, kind, objs) = r?;
                match message(py, seq, kind, &objs) {
                    Ok(m) => Small::Took(m),
                    Err(e) => {
                        // Taken and released: keep its parts for the next get.
                        let objs = objs.into_iter().map(Bound::unbind).collect();
                        self.stash_front(Pending::Built(seq, kind, objs));
                        return Err(e);
                    }
                }
            }
            Small::NotSmall => Small::NotSmall,
            Small::Empty => Small::Empty,
            Small::Busy => Small::Busy,
        })
    }

    /// Builds `(seq, kind, [parts])` tuples and releases the claims. If building fails
    /// (MemoryError), the claims are kept, still claimed, for the next get.
    fn materialize<'py>(
        &self,
        py: Python<'py>,
        claims: Vec<Claimed>,
    ) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        let mut guard = ClaimGuard { q: &self.q, claims };
        match self.build(py, &guard) {
            Ok(out) => {
                drop(guard);
                Ok(out)
            }
            Err(e) => {
                self.stash_front(Pending::Claims(std::mem::take(&mut guard.claims)));
                Err(e)
            }
        }
    }

    /// The Python objects of claimed messages (copies made with the GIL released).
    fn build<'py>(
        &self,
        py: Python<'py>,
        guard: &ClaimGuard<'_>,
    ) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        let mut copies = Copies(Vec::new());
        let mut out = Vec::with_capacity(guard.claims.len());
        for c in &guard.claims {
            let mut parts = Vec::with_capacity(c.parts.len());
            for (i, &(off, len)) in c.parts.iter().enumerate() {
                let len = len as usize;
                let src = self.q.part_ptr(c, i);
                if let Some((_, buf, roff, rlen)) = c.refs.iter().find(|r| r.0 == i) {
                    let view = ShmBuffer::new(buf.clone(), *roff as usize, *rlen as usize);
                    parts.push(Bound::new(py, view)?.into_any());
                    continue;
                }
                let obj = match (&c.side, i) {
                    (Some(seg), i) if i > 0 => {
                        Bound::new(py, ShmBuffer::new(seg.clone(), off as usize, len))?.into_any()
                    }
                    (_, 0) => new_bytes(py, src, len)?,
                    _ if len <= GIL_COPY_LIMIT => new_bytearray(py, src, len)?,
                    _ => {
                        // SAFETY: a NULL source makes CPython allocate `len` uninitialized
                        // bytes; we fill all of them below, before anyone sees the object.
                        unsafe {
                            let p = ffi::PyByteArray_FromStringAndSize(
                                std::ptr::null(),
                                len as ffi::Py_ssize_t,
                            );
                            let b = Bound::from_owned_ptr_or_err(py, p)?;
                            let dst = ffi::PyByteArray_AsString(b.as_ptr()) as *mut u8;
                            copies.0.push((src, dst, len));
                            b
                        }
                    }
                };
                parts.push(obj);
            }
            out.push(message(py, c.seq, c.kind, &parts)?);
        }
        if !copies.0.is_empty() {
            detach(py, move || {
                let copies = copies;
                for (src, dst, len) in copies.0 {
                    // SAFETY: see `Copies`; source and destination do not overlap.
                    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
                }
            });
        }
        Ok(out)
    }
}

#[pymethods]
impl PyQueue {
    /// Creates a queue in a new shared-memory segment owned by this process.
    #[new]
    #[pyo3(signature = (capacity_bytes = 64 << 20, max_messages = 65536, max_inline = None,
                        side_budget = None, spin_us = 20, pool_bytes = None,
                        pool_min = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        capacity_bytes: u64,
        max_messages: u64,
        max_inline: Option<u64>,
        side_budget: Option<u64>,
        spin_us: u64,
        pool_bytes: Option<u64>,
        pool_min: Option<u64>,
    ) -> PyResult<Self> {
        let cfg = QueueConfig {
            ring_bytes: capacity_bytes,
            max_messages,
            max_inline,
            side_budget,
            pool_bytes,
            pool_min,
        };
        let mut q = detach(py, || Queue::create(&cfg)).py_err()?;
        q.set_spin(Duration::from_micros(spin_us));
        Ok(PyQueue::over(q))
    }

    /// Attaches to a queue by segment name (what pickling a Queue does in the receiving
    /// process).
    #[staticmethod]
    #[pyo3(signature = (name, spin_us = 20))]
    fn attach(name: &str, spin_us: u64) -> PyResult<Self> {
        let mut q = Queue::attach(name).py_err()?;
        q.set_spin(Duration::from_micros(spin_us));
        Ok(PyQueue::over(q))
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, (String,))> {
        let attach = slf.get_type().getattr("attach")?;
        Ok((attach, (slf.get().q.name().to_owned(),)))
    }

    fn __repr__(&self) -> String {
        format!(
            "<easycore Queue {} ring={} max_messages={} pending={}{}>",
            self.q.name(),
            self.q.ring_size(),
            self.q.max_messages(),
            self.q.len(),
            if self.q.is_closed() { " closed" } else { "" }
        )
    }

    /// The shared-memory segment's name.
    #[getter]
    fn name(&self) -> &str {
        self.q.name()
    }

    /// Bytes in the ring.
    #[getter]
    fn ring_size(&self) -> u64 {
        self.q.ring_size()
    }

    /// Largest record kept in the ring; larger messages travel in side segments.
    #[getter]
    fn max_inline(&self) -> u64 {
        self.q.max_inline()
    }

    /// Most messages in the queue at once.
    #[getter]
    fn max_messages(&self) -> u64 {
        self.q.max_messages()
    }

    /// Whether anyone closed the queue.
    #[getter]
    fn closed(&self) -> bool {
        self.q.is_closed()
    }

    /// Seconds this handle's calls waited for a message or for room (not the time their
    /// copies took).
    #[getter]
    fn wait_seconds(&self) -> f64 {
        self.q.waited().as_secs_f64()
    }

    /// `(bytes, cap)`: bytes of pooled side segments kept for reuse now, and the most kept.
    fn pool_bytes(&self) -> (u64, u64) {
        self.q.pool_bytes()
    }

    /// Raises the pool's cap (the most bytes of pooled segments kept) to `cap` if it is lower;
    /// it never shrinks. Returns the cap now.
    fn grow_pool(&self, cap: u64) -> u64 {
        self.q.grow_pool(cap)
    }

    /// `(messages, payload_bytes)` put since creation, by everyone.
    fn totals(&self) -> (u64, u64) {
        self.q.totals()
    }

    /// Messages waiting to be got.
    fn qsize(&self) -> u64 {
        self.q.len()
    }

    fn __len__(&self) -> usize {
        self.q.len() as usize
    }

    /// Whether no message waits.
    fn empty(&self) -> bool {
        self.q.is_empty()
    }

    /// Closes the queue for everyone: blocked calls wake with QueueClosed; gets drain first.
    /// Pooled segments that no message holds are unlinked at once, the others when freed.
    fn close(&self, py: Python<'_>) {
        let deadline = Instant::now() + Duration::from_millis(500);
        detach(py, || self.q.close(Some(deadline)))
    }

    /// The identity tag (`<pid>-<nonce>`) of the process that created the queue.
    #[getter]
    fn owner(&self) -> Option<String> {
        self.q.owner().map(|id| id.tag())
    }

    /// Checks the queue's invariants (positions, counters against the ring); raises
    /// InvalidArgument describing the first mismatch. For tests and diagnostics.
    #[pyo3(signature = (timeout = 10.0))]
    fn audit(&self, py: Python<'_>, timeout: f64) -> PyResult<()> {
        check_timeout(Some(timeout))?;
        let deadline = Instant::now() + Duration::from_secs_f64(timeout.min(1e6));
        detach(py, || self.q.audit(Some(deadline))).py_err()
    }

    /// Removes the segment's name (call once every process has attached).
    fn unlink(&self) -> PyResult<()> {
        self.q.unlink().py_err()
    }

    /// Frees records left mid-write or mid-read by dead processes; returns how many.
    fn recover(&self, py: Python<'_>) -> usize {
        detach(py, || self.q.recover())
    }

    /// Puts one message. `parts` is a bytes-like object or a list/tuple of them.
    #[pyo3(signature = (seq, kind, parts, block = true, timeout = None))]
    fn put(
        &self,
        py: Python<'_>,
        seq: u64,
        kind: u32,
        parts: &Bound<'_, PyAny>,
        block: bool,
        timeout: Option<f64>,
    ) -> PyResult<()> {
        if let Ok(b) = parts.cast_exact::<PyBytes>() {
            // The common case, one `bytes` part: no buffer-protocol round trip.
            let one = [b.as_bytes()];
            let msgs = [(seq, kind, &one[..])];
            return self
                .put_all(py, &msgs, one[0].len(), block, timeout)
                .map(|_| ());
        }
        let objs = split_parts(parts)?;
        let views = BorrowedParts::new(&objs)?;
        let slices = views.slices();
        let matched = match_parts(self.q.name(), &slices, REF_MIN);
        let r = if matched.is_empty() {
            let msgs = [(seq, kind, &slices[..])];
            self.put_all(py, &msgs, views.total(), block, timeout)
                .map(|_| ())
        } else {
            match self.put_by_ref(py, seq, kind, &slices, matched, block, timeout) {
                // A lease was lost (taken from a party judged dead): copy instead.
                Ok(false) => {
                    let msgs = [(seq, kind, &slices[..])];
                    self.put_all(py, &msgs, views.total(), block, timeout)
                        .map(|_| ())
                }
                r => r.map(|_| ()),
            }
        };
        drop(views);
        r
    }

    /// Leases `nbytes` of a pooled shared segment of this queue to build a message part in
    /// (see `ShmLease`), waiting at most `timeout` seconds for the queue's lock. None when
    /// the pool has no room for it now (it never waits for room).
    #[pyo3(signature = (nbytes, timeout = 10.0))]
    fn lease(&self, py: Python<'_>, nbytes: usize, timeout: f64) -> PyResult<Option<ShmLease>> {
        check_timeout(Some(timeout))?;
        let d = Instant::now() + Duration::from_secs_f64(timeout.min(1e6));
        let got = detach(py, || self.q.lease_slot(nbytes as u64, Some(d)));
        match got {
            Ok(Some(w)) => Ok(Some(ShmLease::new(self.q.name(), nbytes, w))),
            Ok(None) => Ok(None),
            Err(e) => Err(to_py(py, e)),
        }
    }

    /// Bodies of at least this many bytes travel in pooled segments when the pool has room.
    #[getter]
    fn pool_min(&self) -> u64 {
        self.q.pool_min()
    }

    /// Bytes of large messages (outside the ring) the queue holds at once.
    #[getter]
    fn side_budget(&self) -> u64 {
        self.q.side_budget()
    }

    /// Puts `(seq, kind, parts)` messages in order; returns how many (all, or raises
    /// QueueFull naming how many were put before the timeout).
    #[pyo3(signature = (messages, block = true, timeout = None))]
    fn put_many(
        &self,
        py: Python<'_>,
        messages: &Bound<'_, PyAny>,
        block: bool,
        timeout: Option<f64>,
    ) -> PyResult<usize> {
        let mut heads = Vec::new();
        let mut objs = Vec::new();
        let mut counts = Vec::new();
        for m in messages.try_iter()? {
            let (seq, kind, parts): (u64, u32, Bound<'_, PyAny>) = m?.extract()?;
            let p = split_parts(&parts)?;
            counts.push(p.len());
            objs.extend(p);
            heads.push((seq, kind));
        }
        let views = BorrowedParts::new(&objs)?;
        let slices = views.slices();
        let mut msgs = Vec::with_capacity(heads.len());
        let mut at = 0;
        for ((seq, kind), n) in heads.into_iter().zip(counts) {
            msgs.push((seq, kind, &slices[at..at + n]));
            at += n;
        }
        let r = self.put_all(py, &msgs, views.total(), block, timeout);
        drop(views);
        r
    }

    /// Gets one message as `(seq, kind, parts)`.
    #[pyo3(signature = (block = true, timeout = None))]
    fn get<'py>(
        &self,
        py: Python<'py>,
        block: bool,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        check_timeout(timeout)?;
        if let Some(mut m) = self.take_pending(py, 1)? {
            return Ok(m.remove(0));
        }
        // The deadline, computed on first need: a get served at once never reads the clock.
        let mut d: Option<Option<Instant>> = None;
        // The readers' wake-up word is read only after a miss (then the queue is looked at
        // once more before sleeping), so a get served at once touches one cache line less.
        let mut stamp = None;
        // How the last wait ended, settled by the look that follows it (Queue::settle_read_spin).
        let mut how = Waited::Woke;
        loop {
            let took = self.take_small(py);
            let got = !matches!(took, Ok(Small::Empty));
            self.q
                .settle_read_spin(std::mem::replace(&mut how, Waited::Woke), got);
            match took {
                Ok(Small::Took(t)) => break Ok(t),
                Ok(Small::NotSmall | Small::Busy) => {
                    if d.is_none() {
                        d = Some(deadline(block, timeout)?);
                    }
                    let d = d.flatten();
                    break self
                        .claim(py, 1, d)
                        .and_then(|c| Ok(self.materialize(py, c)?.remove(0)));
                }
                Ok(Small::Empty) => {}
                Err(e) => break Err(e),
            }
            let Some(seen) = stamp.take() else {
                stamp = Some(self.q.data_stamp());
                continue;
            };
            if d.is_none() {
                d = Some(deadline(block, timeout)?);
            }
            let d = d.flatten();
            if expired(d) {
                break Err(to_py(py, CoreError::Empty));
            }
            let t = tick(d);
            how = detach(py, || self.q.wait_readable(seen, Some(t)));
            if let Err(e) = py.check_signals() {
                break Err(e);
            }
        }
    }

    /// Gets between 1 and `max_messages` messages (blocking only for the first).
    #[pyo3(signature = (max_messages = 64, block = true, timeout = None))]
    fn get_many<'py>(
        &self,
        py: Python<'py>,
        max_messages: usize,
        block: bool,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyList>> {
        let d = deadline(block, timeout)?;
        if let Some(m) = self.take_pending(py, max_messages.max(1))? {
            return self.list_of(py, m);
        }
        let claims = self.claim(py, max_messages.max(1), d)?;
        let msgs = self.materialize(py, claims)?;
        self.list_of(py, msgs)
    }
}
