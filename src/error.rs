//! The core's one error type. The Python bindings map each variant to one class of the
//! `easycore.errors` hierarchy (see `python/errors.rs`), so messages are written for users.

use std::fmt;
use std::io;

/// Every failure the core can report.
#[derive(Debug)]
pub enum CoreError {
    /// The queue was closed: no more puts; gets fail once it is drained.
    Closed,
    /// Nothing to get before the deadline (or at once, for a non-blocking get).
    Empty,
    /// No room to put before the deadline (or at once, for a non-blocking put).
    Full,
    /// A lock was not acquired before the deadline.
    Timeout(String),
    /// The queue's lock is held by a live process (perhaps a stopped one) past the deadline,
    /// or, for calls that only try it, right now.
    Busy {
        /// pid of the holder, when known
        holder_pid: Option<u32>,
    },
    /// A batch failed after `done` of its messages were put: they are in the queue.
    Partial {
        /// messages put before the failure
        done: usize,
        /// what failed
        source: Box<CoreError>,
    },
    /// Shared memory could not be had: too little room in `/dev/shm`, or a limit.
    NoSpace {
        /// bytes that were asked for
        requested: u64,
        /// bytes free in the shared-memory file system when the request failed, if known
        available: Option<u64>,
        /// total size of the shared-memory file system, if known
        total: Option<u64>,
    },
    /// A shared-memory segment is not what a queue of this version expects.
    BadSegment(String),
    /// A wrong argument (size, window, sequence number).
    Invalid(String),
    /// The queue's repair judged this process dead while it was writing (its liveness could
    /// not be proven) and gave its message up: the message was not put. Says which message.
    JudgedDead(String),
    /// An operating-system error, with what was being done.
    Io {
        /// what was being done, e.g. "shm_open /ec.123.4567"
        context: String,
        /// the OS error
        source: io::Error,
    },
}

impl CoreError {
    /// `e` after `done` messages of a batch went in.
    pub fn partial(done: usize, e: CoreError) -> Self {
        match e {
            CoreError::Partial { done: d, source } => CoreError::Partial {
                done: done + d,
                source,
            },
            e => CoreError::Partial {
                done,
                source: Box::new(e),
            },
        }
    }

    /// Wraps the last OS error with a description of what failed.
    pub fn last_os(context: impl Into<String>) -> Self {
        CoreError::Io {
            context: context.into(),
            source: io::Error::last_os_error(),
        }
    }
}

/// Short alias used throughout the core.
pub type Result<T> = std::result::Result<T, CoreError>;

fn human(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

impl fmt::Display for CoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CoreError::Closed => write!(f, "the queue is closed"),
            CoreError::Empty => write!(f, "the queue is empty"),
            CoreError::Full => write!(f, "the queue is full"),
            CoreError::Timeout(what) => write!(f, "timed out: {what}"),
            CoreError::Busy { holder_pid } => match holder_pid {
                Some(pid) => write!(
                    f,
                    "the queue's lock is held by process {pid}, which is alive (perhaps \
                     stopped)"
                ),
                None => write!(f, "the queue's lock is held by another process"),
            },
            CoreError::Partial { done, source } => {
                write!(f, "{source} (after {done} messages of the batch were put)")
            }
            CoreError::NoSpace {
                requested,
                available,
                total,
            } => {
                write!(
                    f,
                    "not enough shared memory: asked for {} in /dev/shm",
                    human(*requested)
                )?;
                if let (Some(a), Some(t)) = (available, total) {
                    write!(f, ", which has {} free of {}", human(*a), human(*t))?;
                }
                write!(
                    f,
                    ". Enlarge /dev/shm (in docker: --shm-size=8g), free it of stale files, \
                     or use smaller queues (lower queue_scale)"
                )
            }
            CoreError::BadSegment(why) => write!(f, "bad shared-memory segment: {why}"),
            CoreError::Invalid(why) => write!(f, "{why}"),
            CoreError::JudgedDead(what) => write!(
                f,
                "{what} was not put: another process of the queue judged this process dead \
                 while it wrote the message (its liveness token was missing) and gave the \
                 message up; nothing acknowledged was lost, put it again if it is still wanted"
            ),
            CoreError::Io { context, source } => write!(f, "{context}: {source}"),
        }
    }
}

impl std::error::Error for CoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CoreError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_space_message_says_what_to_do() {
        let e = CoreError::NoSpace {
            requested: 3 << 20,
            available: Some(1 << 20),
            total: Some(64 << 20),
        };
        let s = e.to_string();
        assert!(s.contains("3.0 MiB"), "{s}");
        assert!(s.contains("1.0 MiB free of 64.0 MiB"), "{s}");
        assert!(s.contains("--shm-size"), "{s}");
    }
}
