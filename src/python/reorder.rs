//! `easycore._core.ReorderBuffer`: the core's reorder buffer holding Python objects.

use super::errors::IntoPy;
use crate::reorder::ReorderBuffer;
use pyo3::prelude::*;
use pyo3::types::PyList;

/// Hands out items in sequence order, holding at most `window` early arrivals.
#[pyclass(module = "easycore._core", name = "ReorderBuffer")]
pub struct PyReorderBuffer {
    rb: ReorderBuffer<Py<PyAny>>,
}

#[pymethods]
impl PyReorderBuffer {
    #[new]
    #[pyo3(signature = (window, start = 0))]
    fn new(window: usize, start: u64) -> PyResult<Self> {
        Ok(PyReorderBuffer {
            rb: ReorderBuffer::new(window, start).py_err()?,
        })
    }

    /// The window size.
    #[getter]
    fn window(&self) -> usize {
        self.rb.window()
    }

    /// The next sequence number to be handed out.
    #[getter]
    fn next_seq(&self) -> u64 {
        self.rb.next_seq()
    }

    fn __len__(&self) -> usize {
        self.rb.len()
    }

    /// Whether `seq` may be pushed now (inside the window).
    fn admits(&self, seq: u64) -> bool {
        self.rb.admits(seq)
    }

    /// Stores `item` under `seq`; InvalidArgument outside the window or for a duplicate.
    fn push(&mut self, seq: u64, item: Py<PyAny>) -> PyResult<()> {
        self.rb.push(seq, item).py_err()
    }

    /// Removes and returns every item that is next in order (possibly none).
    fn pop_ready<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let mut out = Vec::new();
        while let Some((_, item)) = self.rb.pop() {
            out.push(item);
        }
        PyList::new(py, out)
    }

    /// Gives up on the next sequence number; returns its item if it had one, else None.
    fn skip(&mut self) -> Option<Py<PyAny>> {
        self.rb.skip()
    }

    /// Drops every held item and restarts at `start`.
    #[pyo3(signature = (start = 0))]
    fn reset(&mut self, start: u64) {
        self.rb.reset(start)
    }
}
