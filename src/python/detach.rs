//! Releasing the GIL around a blocking wait, safely at interpreter exit.
//!
//! Up to Python 3.13, a thread that takes the GIL back while the interpreter finalizes is
//! ended by CPython with `pthread_exit`. Its forced unwind then runs through our Rust
//! frames. Rust cannot let a foreign unwind through, and the process aborts with
//! "FATAL: exception not rethrown" (exit status 134). This hits any daemon thread still
//! waiting in one of our queues when the program exits. The engine's receiving threads do
//! this, and so does a user's thread polling a `Queue`. Our waits also wake every
//! `SIGNAL_TICK` to check signals, so the timing lines up easily (30 of 30 runs of such a
//! script aborted).
//!
//! [`detach`] checks, before it takes the GIL back, whether the program is exiting. If it
//! is, and this thread is not the main thread, the thread parks for good. The process then
//! exits around it, as Python 3.14 does with every such thread. The main thread (tid ==
//! pid) finalizes the interpreter, so it never parks.
//!
//! Checking for finalization alone is not enough. A thread that checked just before it
//! began then waits for the GIL, which the main thread holds while it finalizes, and is
//! ended when it gets it. So "exiting" starts earlier, in an `atexit` hook registered when
//! this module is first imported. Hooks run last-registered first, so this one runs after
//! the runners' and pools' own exit hooks, which still need their threads. The hook sets
//! [`EXITING`], then gives the GIL away, up to a second in all, until no thread is between
//! its check and the GIL (counted in [`RETURNING`]). A thread checks after it counts
//! itself, and the hook reads the count after it sets the flag; both use SeqCst, so at least
//! one side sees the other.
//!
//! The flag is never cleared. A program that runs its exit hooks by hand
//! (`atexit._run_exitfuncs()`) and then goes on would find its easycore threads parked.

use pyo3::prelude::*;
use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Set by the exit hook ([`prepare_exit`]): from then on, threads other than the main thread
/// park instead of taking the GIL back. Never cleared.
static EXITING: AtomicBool = AtomicBool::new(false);

/// Threads past their wait that have not taken the GIL back yet: each counts itself before it
/// checks [`EXITING`], and uncounts itself once it holds the GIL (or parks).
static RETURNING: AtomicUsize = AtomicUsize::new(0);

type IsFinalizing = unsafe extern "C" fn() -> c_int;

/// `Py_IsFinalizing` (3.13+) or `_Py_IsFinalizing` (3.11, 3.12), looked up once. Neither is
/// in the limited API that our abi3 build links against. Both read the runtime's
/// finalizing state with an atomic load, so they are safe to call without the GIL.
static IS_FINALIZING: OnceLock<Option<IsFinalizing>> = OnceLock::new();

fn lookup() -> Option<IsFinalizing> {
    const NAMES: [&CStr; 2] = [c"Py_IsFinalizing", c"_Py_IsFinalizing"];
    for name in NAMES {
        // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only reads the loaded
        // objects' symbol tables; it returns null when the symbol is absent.
        let p: *mut c_void = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
        if !p.is_null() {
            // SAFETY: both symbols are CPython functions of type `int (void)`.
            return Some(unsafe { std::mem::transmute::<*mut c_void, IsFinalizing>(p) });
        }
    }
    None
}

/// Whether the interpreter is finalizing (false if that cannot be told).
fn finalizing() -> bool {
    match IS_FINALIZING.get_or_init(lookup) {
        // SAFETY: see IS_FINALIZING: an atomic read of the runtime state, no GIL needed.
        Some(f) => unsafe { f() != 0 },
        None => false,
    }
}

/// Whether this is the process's initial thread, the one that finalizes the interpreter.
/// Asked afresh each time: a thread that forks becomes its child's initial thread.
fn main_thread() -> bool {
    // SAFETY: gettid and getpid take no arguments and cannot fail.
    unsafe { libc::gettid() == libc::getpid() }
}

/// `py.detach(f)` (whose `Ungil` bound is `Send` on stable Rust), except that a thread other
/// than the main thread never takes the GIL back once the program is exiting: it parks.
pub(crate) fn detach<T, F>(py: Python<'_>, f: F) -> T
where
    F: Send + FnOnce() -> T,
    T: Send,
{
    let out = py.detach(|| {
        let out = f();
        RETURNING.fetch_add(1, SeqCst);
        if (EXITING.load(SeqCst) || finalizing()) && !main_thread() {
            RETURNING.fetch_sub(1, SeqCst);
            loop {
                std::thread::park();
            }
        }
        out
    });
    RETURNING.fetch_sub(1, SeqCst);
    out
}

/// The exit hook (see the module's documentation): from now on, threads coming back from a
/// wait park; gives the GIL to those already on their way back, for at most a second.
#[pyfunction]
fn _prepare_exit(py: Python<'_>) {
    EXITING.store(true, SeqCst);
    let deadline = Instant::now() + Duration::from_secs(1);
    while RETURNING.load(SeqCst) > 0 && Instant::now() < deadline {
        py.detach(|| std::thread::sleep(Duration::from_millis(1)));
    }
}

/// In a forked child only the forking thread lives on, and it is not returning from a wait:
/// the count it inherited would make the child's exit hook wait its full second for nobody.
extern "C" fn reset_in_child() {
    RETURNING.store(0, SeqCst);
}

/// Adds `_prepare_exit` to the module and registers it with `atexit`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // SAFETY: registers a handler that only stores to an atomic, which is async-signal-safe
    // as the child side of fork requires; the return value only reports ENOMEM.
    unsafe { libc::pthread_atfork(None, None, Some(reset_in_child)) };
    m.add_function(wrap_pyfunction!(_prepare_exit, m)?)?;
    let hook = m.getattr("_prepare_exit")?;
    m.py().import("atexit")?.call_method1("register", (hook,))?;
    Ok(())
}
