//! `easycore._core.FileLock`: the core's inter-process file lock for Python.

use super::detach::detach;
use super::errors::{make, IntoPy};
use super::{check_timeout, deadline, expired, tick};
use crate::filelock::{Holder, SharedFileLock};
use pyo3::prelude::*;

/// An exclusive lock on a file, across processes and threads; released if the holder dies.
///
/// `acquire(blocking=True, timeout=None)` returns whether the lock was taken (False on
/// timeout, like `threading.Lock`); `with lock:` waits up to the `timeout` given at
/// construction (None: forever) and raises `EasycoreTimeoutError` past it. Threads sharing one
/// object wait for each other; the thread that holds it gets an error if it enters it again.
#[pyclass(module = "easycore._core", name = "FileLock", frozen)]
pub struct PyFileLock {
    inner: SharedFileLock,
    timeout: Option<f64>,
}

impl PyFileLock {
    fn acquire_inner(&self, py: Python<'_>, block: bool, timeout: Option<f64>) -> PyResult<bool> {
        let d = deadline(block, timeout)?;
        loop {
            let t = tick(d);
            if detach(py, || self.inner.acquire_until(Some(t))).py_err()? {
                return Ok(true);
            }
            if expired(d) {
                return Ok(false);
            }
            py.check_signals()?;
        }
    }

    fn timeout_message(&self) -> String {
        let who = match self.inner.holder() {
            Holder::OtherThread => {
                "another thread of this process holds it through the same lock object".to_string()
            }
            Holder::ThisProcess => "this process holds it, through another lock object on the \
                                    same file (file_lock is not reentrant)"
                .to_string(),
            Holder::Process(pid) => format!("process {pid} holds it"),
            Holder::Unknown => "another process holds it".to_string(),
        };
        format!(
            "could not lock {} within {} s: {who}. Raise the timeout if the holder needs \
             longer; a lock whose holder dies is released at once",
            self.inner.path().display(),
            self.timeout.unwrap_or(0.0)
        )
    }
}

#[pymethods]
impl PyFileLock {
    #[new]
    #[pyo3(signature = (path, timeout = None))]
    fn new(path: std::path::PathBuf, timeout: Option<f64>) -> PyResult<Self> {
        check_timeout(timeout)?;
        Ok(PyFileLock {
            inner: SharedFileLock::new(path),
            timeout,
        })
    }

    /// The locked file.
    #[getter]
    fn path(&self) -> String {
        self.inner.path().to_string_lossy().into_owned()
    }

    /// Whether this object holds the lock.
    #[getter]
    fn locked(&self) -> bool {
        self.inner.is_locked()
    }

    /// Takes the lock; False if `timeout` seconds passed (or at once when not blocking).
    #[pyo3(signature = (blocking = true, timeout = None))]
    fn acquire(&self, py: Python<'_>, blocking: bool, timeout: Option<f64>) -> PyResult<bool> {
        self.acquire_inner(py, blocking, timeout)
    }

    /// Releases the lock (a no-op if not held).
    fn release(&self) {
        self.inner.release()
    }

    fn __enter__(slf: Bound<'_, Self>) -> PyResult<Bound<'_, Self>> {
        let me = slf.get();
        if !me.acquire_inner(slf.py(), true, me.timeout)? {
            return Err(make(slf.py(), "EasycoreTimeoutError", me.timeout_message()));
        }
        Ok(slf)
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, _args: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.release();
        false
    }

    fn __repr__(&self) -> String {
        format!(
            "<easycore FileLock {} {}>",
            self.inner.path().display(),
            if self.locked() { "locked" } else { "unlocked" }
        )
    }
}
