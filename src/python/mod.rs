//! Python bindings (`easycore._core`). Thin: argument conversion, the GIL, signal checks and
//! error mapping; the logic lives in the pure-Rust modules.

mod buffers;
mod detach;
mod errors;
mod filelock;
mod lease;
mod lifelines;
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

/// Removes shared-memory segments left by easycore processes that no longer exist, and the
/// names of queues no process uses any more. Runs without the GIL (it reads `/dev/shm`).
#[pyfunction]
fn sweep_stale_segments(py: Python<'_>) -> usize {
    detach::detach(py, crate::sweep::sweep_stale)
}

/// Removes the names (liveness tokens, segments) of the processes with these pids, if they are
/// dead: for a parent that has reaped its children. Runs without the GIL.
#[pyfunction]
fn sweep_dead_pids(py: Python<'_>, pids: Vec<u32>) -> usize {
    detach::detach(py, move || crate::sweep::sweep_pids(&pids))
}

/// For a process on its way out: lets go of every queue it holds and removes the names of
/// those that no process holds any more (it was the last to use them). Returns how many names
/// were removed. Its queue handles should not be used after.
#[pyfunction]
fn leave_queues(py: Python<'_>) -> usize {
    detach::detach(py, crate::sweep::leave_queues)
}

/// In a process just forked: lets go of the queue holds it inherited, except those of the
/// queues named in `keep` (its own). Returns how many were let go.
#[pyfunction]
#[pyo3(signature = (keep=Vec::new()))]
fn drop_inherited_holds(keep: Vec<String>) -> PyResult<usize> {
    let mut tags = Vec::with_capacity(keep.len());
    for name in &keep {
        let tag = name
            .trim_start_matches('/')
            .split('.')
            .nth(1)
            .and_then(crate::liveness::QueueTag::from_tag)
            .ok_or_else(|| errors::invalid(&format!("not a queue's name: {name:?}")))?;
        tags.push(tag);
    }
    Ok(crate::liveness::drop_inherited_holds(&tags))
}

/// `(free_bytes, total_bytes)` of /dev/shm, or None where it cannot be asked.
#[pyfunction]
fn shm_space() -> Option<(u64, u64)> {
    crate::shm::shm_space()
}

/// Sets glibc's mmap and trim thresholds of this process (`heap.rs`); false where the C
/// library is not glibc or refused a value.
#[pyfunction]
fn set_malloc_thresholds(mmap: u32, trim: u32) -> bool {
    crate::heap::set_malloc_thresholds(mmap, trim)
}

/// Whether the process with this identity tag (`<pid>-<nonce>`, as `Queue.owner`) is alive,
/// judged by its liveness token (zombies are dead, stopped processes alive).
#[pyfunction]
fn owner_alive(tag: &str) -> PyResult<bool> {
    let id = crate::liveness::Identity::from_tag(tag)
        .ok_or_else(|| errors::invalid(&format!("not an identity tag: {tag:?}")))?;
    Ok(crate::liveness::alive(id))
}

/// This process's identity tag (`<pid>-<nonce>`), making its liveness token if needed.
#[pyfunction]
fn identity() -> PyResult<String> {
    use errors::IntoPy;
    crate::liveness::me().map(|id| id.tag()).py_err()
}

/// Removes this process's liveness token at once (others then read it as dead). Call it only
/// right before dying of a signal, when exit handlers will not run.
#[pyfunction]
fn retire_identity() {
    crate::liveness::retire();
}

/// Starts a watchdog thread that waits (without polling) for the death of the process
/// `owner_tag`, then removes the shared memory it left (and that of the queues this process
/// was the last to use) and ends this process at once with
/// `exit_code` (`_exit`: no Python code runs). For processes that must not outlive their
/// parent, whatever kills it. Returns immediately.
#[pyfunction]
#[pyo3(signature = (owner_tag, exit_code = 70))]
fn exit_when_dead(owner_tag: &str, exit_code: i32) -> PyResult<()> {
    let id = crate::liveness::Identity::from_tag(owner_tag)
        .ok_or_else(|| errors::invalid(&format!("not an identity tag: {owner_tag:?}")))?;
    std::thread::Builder::new()
        .name("easycore-owner-watch".into())
        .spawn(move || {
            block_all_signals();
            crate::liveness::wait_for_death(id);
            crate::sweep::sweep_owner(id);
            // This process ends now, without dropping its queues: let go of them, and remove
            // the names of those it was the last to use.
            crate::sweep::leave_queues();
            // SAFETY: _exit ends the process at once; nothing of ours needs to run.
            unsafe { libc::_exit(exit_code) };
        })
        .map_err(|e| errors::invalid(&format!("cannot start the watchdog thread: {e}")))?;
    Ok(())
}

/// Blocks every signal in the calling thread (a helper thread of ours): signals sent to the
/// process then reach the threads that handle them (Python's, in its main thread), and a
/// signal a producer is ignoring stays with the kernel while the disposition changes.
fn block_all_signals() {
    // SAFETY: `set` is a local sigset_t that sigfillset initialises before pthread_sigmask
    // reads it; pthread_sigmask changes only the calling thread's mask (the old mask is not
    // asked for: null). SIGKILL and SIGSTOP cannot be blocked and are left as they are.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut set);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<queue::PyQueue>()?;
    m.add_class::<buffers::ShmBuffer>()?;
    m.add_class::<lease::ShmLease>()?;
    m.add_class::<lifelines::PyLifelines>()?;
    m.add_class::<reorder::PyReorderBuffer>()?;
    m.add_class::<filelock::PyFileLock>()?;
    m.add_function(wrap_pyfunction!(sweep_stale_segments, m)?)?;
    m.add_function(wrap_pyfunction!(sweep_dead_pids, m)?)?;
    m.add_function(wrap_pyfunction!(shm_space, m)?)?;
    m.add_function(wrap_pyfunction!(set_malloc_thresholds, m)?)?;
    m.add_function(wrap_pyfunction!(drop_inherited_holds, m)?)?;
    m.add_function(wrap_pyfunction!(leave_queues, m)?)?;
    m.add_function(wrap_pyfunction!(owner_alive, m)?)?;
    m.add_function(wrap_pyfunction!(identity, m)?)?;
    m.add_function(wrap_pyfunction!(exit_when_dead, m)?)?;
    m.add_function(wrap_pyfunction!(retire_identity, m)?)?;
    m.add("SHM_PREFIX", crate::shm::NAME_PREFIX)?;
    detach::register(m)?;
    Ok(())
}
