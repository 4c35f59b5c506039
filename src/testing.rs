//! What unit tests that run side by side in one process (cargo's test threads) must not do
//! to each other.
//!
//! A forked child holds every `flock` its parent held (queue tokens), through its copies of
//! the parent's descriptors, until it ends; and a sweep holds each queue token it probes
//! while it looks. A test whose verdict depends on nobody else holding its queue's token
//! (a sweep or a last party removes the names) runs [`alone`]: with no other such test and
//! no forked child of a test that forks ([`forking`]) alive meanwhile.

use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

static FORKS: RwLock<()> = RwLock::new(());

/// Held by a test from before it forks until its children ended (such tests run side by
/// side).
pub(crate) fn forking() -> RwLockReadGuard<'static, ()> {
    FORKS.read().unwrap_or_else(|e| e.into_inner())
}

/// Held by a test that must run alone (see the module).
pub(crate) fn alone() -> RwLockWriteGuard<'static, ()> {
    FORKS.write().unwrap_or_else(|e| e.into_inner())
}
