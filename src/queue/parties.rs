//! The processes using a queue ("parties"): who holds the lock, who is writing or reading a
//! record, who holds a pooled slot, and who sleeps on the wake words. Shared structures store
//! a small party number, and the table maps it to a kernel-vouched identity
//! ([`crate::liveness`]), so a dead party is told apart from a live one whatever its pid says.
//!
//! Life cycle of an entry (each step one atomic compare-and-swap):
//! ```text
//! 0 (free) -> identity      a process registers on first use, no lock
//! dead     -> 0             the lock holder frees the entry of a dead party, after it has
//!                           repaired every record, slot and count that named it
//! dead     -> identity      a process finds no free entry and *adopts* a dead party's: it
//!                           then owns whatever the dead party left, and repairs all of it
//!                           (taking the lock over from itself if need be) before it does
//!                           anything else with the queue (`Queue::party`)
//! ```
//! A dead process never registers again (a new process has a new identity), so a number is
//! never reused while anything still names its old owner, except by an adopter, which
//! repairs first.

use crate::liveness::{self, Identity};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Most processes that can use one queue at once (dead ones are freed by repair).
pub const PARTIES: usize = 64;

/// The table, in the queue header.
#[repr(C)]
pub struct PartyTable {
    /// Packed identities; 0 is a free entry. Party `p` (1-based) is entry `p - 1`.
    ids: [AtomicU64; PARTIES],
    /// Per party: readers asleep (low 16 bits) and writers asleep (high 16 bits). Changed only
    /// by the party itself (atomic add/sub), and zeroed by repair once the party is dead.
    waits: [AtomicU32; PARTIES],
}

/// Which side a sleeping waiter is on.
#[derive(Clone, Copy)]
pub enum Side {
    Reader,
    Writer,
}

impl Side {
    fn unit(self) -> u32 {
        match self {
            Side::Reader => 1,
            Side::Writer => 1 << 16,
        }
    }
}

impl PartyTable {
    /// This identity's party number: its existing entry, a free one it takes now, or (the
    /// table being full) a dead party's entry it adopts (`Some(previous identity)`: the
    /// caller must repair what that party left before using the queue, or give the entry
    /// back with [`PartyTable::give_back`]). `None` when every entry is alive.
    pub fn register(&self, id: Identity) -> Option<(u32, Option<u64>)> {
        let w = id.packed();
        if let Some(i) = self.ids.iter().position(|e| e.load(Ordering::Acquire) == w) {
            return Some((i as u32 + 1, None));
        }
        // A few passes: a repairer may free dead entries between our two scans (they are
        // then neither free in the first scan nor dead in the second).
        for _ in 0..4 {
            for (i, e) in self.ids.iter().enumerate() {
                if e.load(Ordering::Relaxed) == 0
                    && e.compare_exchange(0, w, Ordering::AcqRel, Ordering::Relaxed)
                        .is_ok()
                {
                    return Some((i as u32 + 1, None));
                }
            }
            for (i, e) in self.ids.iter().enumerate() {
                let old = e.load(Ordering::Acquire);
                if Identity::unpack(old).is_some_and(|o| !liveness::alive(o))
                    && e.compare_exchange(old, w, Ordering::AcqRel, Ordering::Relaxed)
                        .is_ok()
                {
                    self.waits[i].store(0, Ordering::Relaxed);
                    return Some((i as u32 + 1, Some(old)));
                }
            }
        }
        None
    }

    /// Gives an adopted entry back to the dead identity it had (the adopter could not repair
    /// yet), so that whoever repairs next still sees that party dead.
    pub fn give_back(&self, p: u32, mine: u64, was: u64) {
        if let Some(e) = (p as usize).checked_sub(1).and_then(|i| self.ids.get(i)) {
            let _ = e.compare_exchange(mine, was, Ordering::AcqRel, Ordering::Relaxed);
        }
    }

    /// The identity of party `p`, if the entry is in use.
    pub fn identity(&self, p: u32) -> Option<Identity> {
        let i = (p as usize).checked_sub(1)?;
        Identity::unpack(self.ids.get(i)?.load(Ordering::Acquire))
    }

    /// Whether party `p` is alive. A free entry or a number out of range is not.
    pub fn alive(&self, p: u32) -> bool {
        self.identity(p).is_some_and(liveness::alive)
    }

    /// The registered parties that are dead now, with the identity each entry held (one
    /// liveness probe each).
    pub fn dead(&self) -> Vec<(u32, u64)> {
        (1..=PARTIES as u32)
            .filter_map(|p| {
                let w = self.ids[p as usize - 1].load(Ordering::Acquire);
                Identity::unpack(w)
                    .is_some_and(|id| !liveness::alive(id))
                    .then_some((p, w))
            })
            .collect()
    }

    /// Under the lock, once nothing names party `p` any more: frees its entry if it still
    /// holds the dead identity `was` (an adopter may have taken it meanwhile).
    pub fn free(&self, p: u32, was: u64) {
        if let Some(i) = (p as usize).checked_sub(1).filter(|&i| i < PARTIES) {
            if self.ids[i]
                .compare_exchange(was, 0, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                self.waits[i].store(0, Ordering::Relaxed);
                // Whoever learns of a death removes the dead party's token (only a genuine,
                // unlocked one: a live process's token is never touched), so tokens of killed
                // processes do not pile up in /dev/shm.
                if let Some(id) = Identity::unpack(was) {
                    liveness::bury(id);
                }
            }
        }
    }

    /// Party `p` starts (`+`) or stops sleeping on one side.
    pub fn note_wait(&self, p: u32, side: Side, starts: bool) {
        if let Some(w) = (p as usize).checked_sub(1).and_then(|i| self.waits.get(i)) {
            if starts {
                w.fetch_add(side.unit(), Ordering::Relaxed);
            } else {
                w.fetch_sub(side.unit(), Ordering::Relaxed);
            }
        }
    }

    /// `(readers, writers)` asleep among the parties still registered.
    pub fn sleeping(&self) -> (u32, u32) {
        let mut r = 0;
        let mut w = 0;
        for (id, waits) in self.ids.iter().zip(&self.waits) {
            if id.load(Ordering::Relaxed) != 0 {
                let v = waits.load(Ordering::Relaxed);
                r += v & 0xffff;
                w += v >> 16;
            }
        }
        (r, w)
    }

    /// Registers a made-up identity (tests: a party that is dead, or never lived).
    #[cfg(test)]
    pub fn register_ghost(&self) -> u32 {
        let me = liveness::me().unwrap();
        self.register(Identity {
            pid: me.pid,
            nonce: me.nonce ^ 0x7777_7777,
        })
        .unwrap()
        .0
    }
}
