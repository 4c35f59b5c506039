//! `easycore._core.FileLock`: the core's inter-process file lock for Python.

use super::errors::{make, IntoPy};
use super::{deadline, expired, tick};
use crate::lock::FileLock;
use pyo3::prelude::*;
use std::path::PathBuf;
use std::sync::Mutex;

/// An exclusive lock on a file, across processes and threads; released if the holder dies.
///
/// `acquire(blocking=True, timeout=None)` returns whether the lock was taken (False on
/// timeout, like `threading.Lock`); `with lock:` waits up to the `timeout` given at
/// construction (None: forever) and raises `EasycoreTimeoutError` past it.
#[pyclass(module = "easycore._core", name = "FileLock", frozen)]
pub struct PyFileLock {
    inner: Mutex<FileLock>,
    path: PathBuf,
    timeout: Option<f64>,
}

impl PyFileLock {
    fn acquire_inner(&self, py: Python<'_>, block: bool, timeout: Option<f64>) -> PyResult<bool> {
        let d = deadline(block, timeout)?;
        loop {
            let t = tick(d);
            let got = py.detach(|| {
                let mut l = self.inner.lock().unwrap_or_else(|p| p.into_inner());
                l.acquire_until(Some(t))
            });
            if got.py_err()? {
                return Ok(true);
            }
            if expired(d) {
                return Ok(false);
            }
            py.check_signals()?;
        }
    }
}

#[pymethods]
impl PyFileLock {
    #[new]
    #[pyo3(signature = (path, timeout = None))]
    fn new(path: PathBuf, timeout: Option<f64>) -> Self {
        PyFileLock {
            inner: Mutex::new(FileLock::new(&path)),
            path,
            timeout,
        }
    }

    /// The locked file.
    #[getter]
    fn path(&self) -> String {
        self.path.to_string_lossy().into_owned()
    }

    /// Whether this object holds the lock.
    #[getter]
    fn locked(&self) -> bool {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_locked()
    }

    /// Takes the lock; False if `timeout` seconds passed (or at once when not blocking).
    #[pyo3(signature = (blocking = true, timeout = None))]
    fn acquire(&self, py: Python<'_>, blocking: bool, timeout: Option<f64>) -> PyResult<bool> {
        self.acquire_inner(py, blocking, timeout)
    }

    /// Releases the lock (a no-op if not held).
    fn release(&self) {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .release()
    }

    fn __enter__(slf: Bound<'_, Self>) -> PyResult<Bound<'_, Self>> {
        let me = slf.get();
        if !me.acquire_inner(slf.py(), true, me.timeout)? {
            return Err(make(
                slf.py(),
                "EasycoreTimeoutError",
                format!(
                    "could not lock {} within {} s: another process holds it. If no process \
                     should, delete the file or raise the timeout",
                    me.path.display(),
                    me.timeout.unwrap_or(0.0)
                ),
            ));
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
            self.path.display(),
            if self.locked() { "locked" } else { "unlocked" }
        )
    }
}
