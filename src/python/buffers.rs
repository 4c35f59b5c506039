//! Buffer-protocol plumbing: borrowing the bytes of any Python buffer (bytes, bytearray,
//! memoryview, `pickle.PickleBuffer`, numpy arrays) without copying, and `ShmBuffer`, a
//! zero-copy window onto a shared-memory segment that keeps the mapping alive while any view
//! of it lives.

use crate::slots::SideBuf;
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use std::os::raw::c_int;
use std::sync::Arc;

/// Borrowed views of several Python buffers, released on drop (with the GIL held: drop it
/// before leaving the function that took the GIL).
pub(crate) struct BorrowedParts {
    // Boxed so a view never moves between PyObject_GetBuffer and PyBuffer_Release: the
    // protocol does not promise that exporters tolerate a moved Py_buffer.
    #[allow(clippy::vec_box)]
    views: Vec<Box<ffi::Py_buffer>>,
}

// SAFETY: the struct only carries raw views whose memory stays valid while the exporting
// objects are alive, which the caller guarantees by holding references to them; the views are
// read (not released) from other threads only inside `detach`, and released with the GIL.
unsafe impl Send for BorrowedParts {}
// SAFETY: as above: shared access only reads the pointers and lengths.
unsafe impl Sync for BorrowedParts {}

impl BorrowedParts {
    /// Takes a C-contiguous read view of each object.
    pub(crate) fn new(objs: &[Bound<'_, PyAny>]) -> PyResult<Self> {
        let mut views = Vec::with_capacity(objs.len());
        for o in objs {
            let mut v: Box<ffi::Py_buffer> = Box::new(ffi::Py_buffer::new());
            // SAFETY: `o` is a live object; on success the view must be released exactly once,
            // which Drop does.
            let r = unsafe { ffi::PyObject_GetBuffer(o.as_ptr(), &mut *v, ffi::PyBUF_SIMPLE) };
            if r != 0 {
                let py = o.py();
                let err = PyErr::take(py).unwrap_or_else(|| PyBufferError::new_err("no buffer"));
                let tname = o
                    .get_type()
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_default();
                return Err(PyBufferError::new_err(format!(
                    "a message part must be a contiguous bytes-like object, got {tname}: {err}"
                )));
            }
            views.push(v);
        }
        Ok(BorrowedParts { views })
    }

    /// The bytes of each view.
    pub(crate) fn slices(&self) -> Vec<&[u8]> {
        self.views
            .iter()
            .map(|v| {
                if v.len == 0 || v.buf.is_null() {
                    &[][..]
                } else {
                    // SAFETY: a PyBUF_SIMPLE view is `len` contiguous bytes at `buf`, valid
                    // until released (in Drop, after every use of these slices).
                    unsafe { std::slice::from_raw_parts(v.buf as *const u8, v.len as usize) }
                }
            })
            .collect()
    }

    /// Total bytes.
    pub(crate) fn total(&self) -> usize {
        self.views.iter().map(|v| v.len as usize).sum()
    }
}

impl Drop for BorrowedParts {
    fn drop(&mut self) {
        for v in &mut self.views {
            // SAFETY: each view was filled by a successful PyObject_GetBuffer and is released
            // once; callers drop this struct while holding the GIL.
            unsafe { ffi::PyBuffer_Release(&mut **v) };
        }
    }
}

/// A writable, zero-copy view of part of a shared-memory segment (a large message's
/// out-of-band buffer). When the last `ShmBuffer` of a message and every memoryview or array
/// made from it are gone, a pooled segment goes back to its queue's pool for reuse and a
/// one-shot segment is unmapped.
#[pyclass(module = "easycore._core", frozen)]
pub struct ShmBuffer {
    seg: Arc<SideBuf>,
    offset: usize,
    len: usize,
}

impl ShmBuffer {
    pub(crate) fn new(seg: Arc<SideBuf>, offset: usize, len: usize) -> Self {
        assert!(offset + len <= seg.len());
        ShmBuffer { seg, offset, len }
    }
}

#[pymethods]
impl ShmBuffer {
    fn __len__(&self) -> usize {
        self.len
    }

    fn __repr__(&self) -> String {
        format!("<ShmBuffer {} bytes>", self.len)
    }

    /// Exposes the bytes (C-contiguous, format "B", writable) to the buffer protocol.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let me = slf.get();
        // SAFETY: offset + len lies inside the mapping (checked in `new`), which lives as long
        // as `slf`, and PyBuffer_FillInfo stores a new reference to `slf` in the view.
        let ptr = unsafe { me.seg.as_ptr().add(me.offset) };
        let r = unsafe {
            ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                ptr.cast(),
                me.len as ffi::Py_ssize_t,
                0,
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
