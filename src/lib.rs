//! easycore's Rust core: the pieces of the runners' data path that must be fast and must not
//! hang, with thin Python bindings (feature `python`) as the private module `easycore._core`.
//!
//! * [`shm`]: named shared-memory segments.
//! * [`sweep`]: removing the names whose owners are gone.
//! * [`wait`]: futex wait/wake on a shared word.
//! * [`spin`]: spinning before a sleep, without yielding, while it pays.
//! * [`lifeline`]: a slot the kernel marks when the thread holding it ends (robust mutex).
//! * [`liveness`]: process identity and liveness the kernel vouches for (flocked tokens).
//! * [`late_leaves`]: queues left while a forking child held a copy of the hold, retried.
//! * [`queue`]: the bounded inter-process message queue.
//! * [`slots`]: the queue's pool of reusable segments for large messages.
//! * [`copy`]: copying a large message's body into its segment, streaming where it is cold.
//! * [`forkviews`]: zero-copy views that a forked child keeps unchanged.
//! * [`shmlock`]: the short shared-memory lock that survives its holder's death.
//! * [`reorder`]: the sequence-ordered reorder buffer.
//! * [`trust`]: opening names in `/dev/shm` that trust nothing another user could plant.
//! * [`filelock`]: the inter-process file lock (flock, timeouts, fork-safe).

pub mod copy;
pub mod error;
pub mod filelock;
pub mod forkviews;
pub mod heap;
pub mod late_leaves;
pub mod lifeline;
pub mod liveness;
pub mod queue;
pub mod reorder;
pub mod shm;
pub mod shmlock;
pub mod slots;
pub mod spin;
pub mod sweep;
pub mod trust;
pub mod wait;

#[cfg(test)]
mod testing;

#[cfg(feature = "python")]
mod python;

#[cfg(feature = "python")]
use pyo3::prelude::*;

/// The extension module: registers the classes and functions of [`python`], nothing else.
#[cfg(feature = "python")]
#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    python::register(m)
}
