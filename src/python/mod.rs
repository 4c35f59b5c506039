//! Python bindings (`easycore._core`). Thin: argument conversion, the GIL, signal checks and
//! error mapping; the logic lives in the pure-Rust modules.

mod buffers;
mod errors;
mod filelock;
mod queue;
mod reorder;

use pyo3::prelude::*;
use std::time::{Duration, Instant};

/// How long a blocking call stays in Rust (GIL released) before it returns to check signals.
pub(crate) const SIGNAL_TICK: Duration = Duration::from_millis(100);

/// Checks a `timeout` argument without reading the clock (calls served at once never need
/// their deadline).
pub(crate) fn check_timeout(timeout: Option<f64>) -> PyResult<()> {
    match timeout {
        Some(t) if t.is_nan() || t < 0.0 => Err(errors::invalid(
            "timeout must be a non-negative number of seconds or None",
        )),
        _ => Ok(()),
    }
}

/// Turns Python's `(block, timeout)` pair into a deadline: `None` waits forever.
pub(crate) fn deadline(block: bool, timeout: Option<f64>) -> PyResult<Option<Instant>> {
    if !block {
        return Ok(Some(Instant::now()));
    }
    check_timeout(timeout)?;
    Ok(timeout.map(|t| Instant::now() + Duration::from_secs_f64(t.min(1e9))))
}

/// The next wait's end: the caller's deadline or one signal tick, whichever is sooner.
pub(crate) fn tick(deadline: Option<Instant>) -> Instant {
    let t = Instant::now() + SIGNAL_TICK;
    deadline.map_or(t, |d| d.min(t))
}

/// Whether a deadline passed.
pub(crate) fn expired(deadline: Option<Instant>) -> bool {
    deadline.is_some_and(|d| Instant::now() >= d)
}

/// Removes shared-memory segments left by easycore processes that no longer exist.
#[pyfunction]
fn sweep_stale_segments() -> usize {
    crate::shm::sweep_stale()
}

/// `(free_bytes, total_bytes)` of /dev/shm, or None where it cannot be asked.
#[pyfunction]
fn shm_space() -> Option<(u64, u64)> {
    crate::shm::shm_space()
}

/// Whether a process with this pid exists.
#[pyfunction]
fn pid_alive(pid: u32) -> bool {
    crate::wait::pid_alive(pid)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<queue::PyQueue>()?;
    m.add_class::<buffers::ShmBuffer>()?;
    m.add_class::<reorder::PyReorderBuffer>()?;
    m.add_class::<filelock::PyFileLock>()?;
    m.add_function(wrap_pyfunction!(sweep_stale_segments, m)?)?;
    m.add_function(wrap_pyfunction!(shm_space, m)?)?;
    m.add_function(wrap_pyfunction!(pid_alive, m)?)?;
    m.add("SHM_PREFIX", crate::shm::NAME_PREFIX)?;
    Ok(())
}
