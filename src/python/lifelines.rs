//! `Lifelines`: a row of [`crate::lifeline`] slots in a writable Python buffer that several
//! processes map (the producers' shared state).

use crate::lifeline::{self, Look, SLOT_BYTES};
use pyo3::exceptions::{PyIndexError, PyOSError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;

/// `count` lifelines from byte `offset` of a writable buffer; the view (and so the memory)
/// is kept until the object goes.
#[pyclass(module = "easycore._core", name = "Lifelines", frozen)]
pub struct PyLifelines {
    // Boxed so the view never moves between PyObject_GetBuffer and PyBuffer_Release.
    view: Box<ffi::Py_buffer>,
    /// Invariant: the first slot, 8-aligned, with `count * SLOT_BYTES` bytes of the view
    /// from there.
    base: *mut u8,
    count: usize,
}

// SAFETY: the view is only used with the GIL held (every method takes `Python`, none detaches),
// which also serializes the looks of this process's threads, as `lifeline::look` requires.
unsafe impl Send for PyLifelines {}
// SAFETY: as above.
unsafe impl Sync for PyLifelines {}

impl PyLifelines {
    /// Lifeline `i`'s slot (`i < count`: inside the view).
    fn at(&self, i: usize) -> *mut u8 {
        self.base.wrapping_add(i * SLOT_BYTES)
    }

    fn slot(&self, i: usize) -> PyResult<*mut u8> {
        if i >= self.count {
            return Err(PyIndexError::new_err(format!(
                "lifeline {i} out of range ({} lifelines)",
                self.count
            )));
        }
        Ok(self.at(i))
    }
}

#[pymethods]
impl PyLifelines {
    #[new]
    fn new(buffer: &Bound<'_, PyAny>, offset: usize, count: usize) -> PyResult<Self> {
        let mut view: Box<ffi::Py_buffer> = Box::new(ffi::Py_buffer::new());
        // SAFETY: `buffer` is a live object; on success the view is released exactly once, by
        // Drop (or below, on a bad request).
        let r = unsafe {
            ffi::PyObject_GetBuffer(
                buffer.as_ptr(),
                &mut *view,
                ffi::PyBUF_WRITABLE | ffi::PyBUF_C_CONTIGUOUS,
            )
        };
        if r != 0 {
            return Err(PyErr::take(buffer.py()).unwrap_or_else(|| {
                PyValueError::new_err("a writable contiguous buffer is needed")
            }));
        }
        let len = usize::try_from(view.len).unwrap_or(0);
        let end = count
            .checked_mul(SLOT_BYTES)
            .and_then(|b| b.checked_add(offset));
        let base = (view.buf as *mut u8).wrapping_add(offset);
        if !end.is_some_and(|e| e <= len) || (base as usize) % 8 != 0 {
            // SAFETY: the view was taken above and is not used again.
            unsafe { ffi::PyBuffer_Release(&mut *view) };
            return Err(PyValueError::new_err(format!(
                "{count} lifelines of {SLOT_BYTES} bytes from byte {offset} do not fit an \
                 8-aligned place in a buffer of {len} bytes"
            )));
        }
        Ok(PyLifelines { view, base, count })
    }

    /// Whether lifelines work on this platform.
    #[staticmethod]
    fn supported() -> bool {
        lifeline::SUPPORTED
    }

    /// Bytes each lifeline takes.
    #[classattr]
    fn slot_bytes() -> usize {
        SLOT_BYTES
    }

    /// Makes lifeline `i` free (before any process holds it).
    fn init(&self, i: usize) -> PyResult<()> {
        let s = self.slot(i)?;
        // SAFETY: `s` is an 8-aligned slot inside the view (invariant of `base`); the caller
        // makes it before the process that holds it starts.
        unsafe { lifeline::init(s) }.map_err(|e| PyOSError::new_err(format!("lifeline: {e}")))
    }

    /// Takes lifeline `i` for the calling thread for good, without waiting: whether it did
    /// (False: a live process holds it).
    fn hold(&self, i: usize) -> PyResult<bool> {
        let s = self.slot(i)?;
        // SAFETY: as in `init`; the view keeps the memory mapped while this object lives, and
        // the producer keeps the mapping for its whole life.
        unsafe { lifeline::hold(s) }.map_err(|e| PyOSError::new_err(format!("lifeline: {e}")))
    }

    /// ``"held"``, ``"dead"`` or ``"free"``: what lifeline `i` says of its holder (the look
    /// that sees it dead frees it: later looks say free).
    fn look(&self, _py: Python<'_>, i: usize) -> PyResult<&'static str> {
        let s = self.slot(i)?;
        // SAFETY: as in `init`; looks are serialized by the GIL.
        Ok(match unsafe { lifeline::look(s) } {
            Look::Held => "held",
            Look::Dead => "dead",
            Look::Free => "free",
        })
    }

    /// Whether every lifeline is held by a live thread (no system call while they are).
    fn all_held(&self, _py: Python<'_>) -> bool {
        (0..self.count).all(|i| {
            // SAFETY: as in `look`; `i < count`.
            unsafe { lifeline::look(self.at(i)) == Look::Held }
        })
    }

    fn __len__(&self) -> usize {
        self.count
    }
}

impl Drop for PyLifelines {
    fn drop(&mut self) {
        // SAFETY: the view was taken in `new`; a pyclass is dropped with the GIL held.
        unsafe { ffi::PyBuffer_Release(&mut *self.view) };
    }
}
