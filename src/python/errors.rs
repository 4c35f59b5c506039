//! Maps [`CoreError`] to the Python exception tree of `easycore.errors` (one root,
//! `EasycoreError`; empty/full/timeout also subclass `queue.Empty`, `queue.Full`,
//! `TimeoutError`, so code that catches the stdlib exceptions keeps working).

use crate::error::CoreError;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyModule;

static ERRORS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

fn class<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
    let m = ERRORS.get_or_try_init(py, || {
        PyModule::import(py, "easycore.errors").map(|m| m.unbind())
    })?;
    m.bind(py).getattr(name)
}

/// Builds an exception of `easycore.errors.<name>` with these arguments.
pub(crate) fn make<'py>(py: Python<'py>, name: &str, args: impl IntoPyObject<'py>) -> PyErr {
    match class(py, name).and_then(|c| c.call1((args,))) {
        Ok(e) => PyErr::from_value(e),
        Err(e) => e,
    }
}

/// A `ValueError`-derived `InvalidArgument`.
pub(crate) fn invalid(msg: &str) -> PyErr {
    Python::attach(|py| make(py, "InvalidArgument", msg))
}

/// Converts a core error, with the GIL held.
pub(crate) fn to_py(py: Python<'_>, e: CoreError) -> PyErr {
    let msg = e.to_string();
    match e {
        CoreError::Closed => make(py, "QueueClosed", msg),
        CoreError::Empty => make(py, "QueueEmpty", msg),
        CoreError::Full => make(py, "QueueFull", msg),
        CoreError::Timeout(_) | CoreError::Busy { .. } => make(py, "EasycoreTimeoutError", msg),
        CoreError::Partial { source, .. } => to_py(py, *source),
        CoreError::NoSpace { .. } | CoreError::BadSegment(_) | CoreError::JudgedDead(_) => {
            make(py, "SharedMemoryError", msg)
        }
        CoreError::Invalid(_) => make(py, "InvalidArgument", msg),
        CoreError::Io { ref source, .. } => {
            let errno = source.raw_os_error().unwrap_or(0);
            match class(py, "EasycoreOSError").and_then(|c| c.call1((errno, msg.clone()))) {
                Ok(v) => PyErr::from_value(v),
                Err(_) => PyRuntimeError::new_err(msg),
            }
        }
    }
}

/// `map_err` helper for results of the core.
pub(crate) trait IntoPy<T> {
    fn py_err(self) -> PyResult<T>;
}

impl<T> IntoPy<T> for Result<T, CoreError> {
    fn py_err(self) -> PyResult<T> {
        self.map_err(|e| Python::attach(|py| to_py(py, e)))
    }
}
