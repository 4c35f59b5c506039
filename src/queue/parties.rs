//! The processes using a queue ("parties"): who holds the lock, who is writing or reading a
//! record, who holds a pooled slot, and who sleeps on the wake words. Shared structures store
//! a small *token* naming a party, and the table maps it to a kernel-vouched identity
//! ([`crate::liveness`]), so a dead party is told apart from a live one whatever its pid says.
//!
//! # Tokens: a party number and its entry's generation
//! A token is `party | generation << PARTY_BITS` (never 0, never with bit 31 set, which the
//! lock keeps for itself): the party number (1-based entry of the table) and the entry's
//! generation at the time the process registered. Every registration in an entry (a free
//! entry taken, or a dead party's adopted) bumps the entry's generation first. So a token
//! names one *registration*, not a reusable number: a token whose generation is not the
//! entry's current one belongs to a process that is gone, whatever process holds the number
//! now. The lock word, records' owners and slots' holders all store tokens, and every
//! verdict "this holder is dead" ([`PartyTable::token_alive`]) is about the registration the
//! token names: a waiter that probed a dead holder and stalled before its compare-and-swap
//! cannot take the lock from a new live process that registered under the same number,
//! since that process's token differs (the ABA of number-only takeover). What remains: the
//! generation has [`GEN_BITS`] bits, so a stale verdict could apply again only after the
//! same entry was registered 2^20 times while one waiter stalled between two instructions.
//!
//! Life cycle of an entry (each step one atomic compare-and-swap on `ids`, then one atomic
//! increment of `gens`):
//! ```text
//! 0 (free) -> identity      a process registers on first use, no lock
//! dead     -> 0             the lock holder frees the entry of a dead party, after it has
//!                           repaired every record, slot and count that named it
//! dead     -> identity      a process finds no free entry and *adopts* a dead party's: the
//!                           dead party's tokens are stale from then on (their generation is
//!                           old), and the adopter repairs what it left before it does
//!                           anything else with the queue (`Queue::party`)
//! ```
//! A dead process never registers again (a new process has a new identity).
//!
//! # Limits
//! [`PARTIES`] processes may be registered at once; dead ones are freed by repair (or their
//! entry adopted), so the limit is on processes *alive at the same time* using one queue.

use crate::liveness::{self, Identity};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Most processes that can use one queue at once (dead ones are freed by repair).
pub const PARTIES: usize = 1024;
/// Bits of a token that hold the party number (1..=[`PARTIES`]).
pub const PARTY_BITS: u32 = 11;
/// Bits of a token that hold the entry's generation (wrapping).
pub const GEN_BITS: u32 = 20;
const PARTY_MASK: u32 = (1 << PARTY_BITS) - 1;
const GEN_MASK: u32 = (1 << GEN_BITS) - 1;
const _: () = assert!(PARTIES < (1 << PARTY_BITS) && PARTY_BITS + GEN_BITS <= 31);

/// The token of party `p` registered at generation `gen`.
pub fn token(p: u32, gen: u32) -> u32 {
    (p & PARTY_MASK) | ((gen & GEN_MASK) << PARTY_BITS)
}

/// `(party, generation)` of a token.
pub fn split(t: u32) -> (u32, u32) {
    (t & PARTY_MASK, (t >> PARTY_BITS) & GEN_MASK)
}

/// The table, in the queue header.
#[repr(C)]
pub struct PartyTable {
    /// Packed identities; 0 is a free entry. Party `p` (1-based) is entry `p - 1`.
    /// Invariant: changed only by one compare-and-swap (register, adopt, free, give back),
    /// and every register, adopt and free is followed by one increment of `gens[p - 1]`
    /// (before a registrant uses its token).
    ids: [AtomicU64; PARTIES],
    /// Per entry: its generation (wrapping, [`GEN_BITS`] used). Only ever incremented, by the
    /// process that just put its identity into the entry or freed it; a token is current
    /// while its generation equals this.
    gens: [AtomicU32; PARTIES],
    /// Per party: readers asleep (low 16 bits) and writers asleep (high 16 bits). Changed only
    /// by the party itself (atomic add/sub), and swapped to 0 (its value subtracted from the
    /// header's totals) when the entry is freed or adopted.
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

/// A registration: the token to store in shared structures, and (for an adopted entry) the
/// dead identity it had and the sleeping counts it left.
pub struct Registered {
    pub token: u32,
    pub adopted: Option<(u64, u32)>,
}

impl PartyTable {
    fn entry(p: u32) -> Option<usize> {
        (p as usize).checked_sub(1).filter(|&i| i < PARTIES)
    }

    /// Bumps entry `i`'s generation after an identity was put in; the new token.
    fn bump(&self, i: usize) -> u32 {
        let g = self.gens[i].fetch_add(1, Ordering::AcqRel).wrapping_add(1);
        token(i as u32 + 1, g)
    }

    /// This identity's token: its existing entry, a free one it takes now, or (the table
    /// being full) a dead party's entry it adopts (`adopted`: the caller must repair what
    /// that party left before using the queue, or give the entry back with
    /// [`PartyTable::give_back`]). `None` when every entry is alive.
    pub fn register(&self, id: Identity) -> Option<Registered> {
        let w = id.packed();
        if let Some(i) = self.ids.iter().position(|e| e.load(Ordering::Acquire) == w) {
            // Registered before (a handle that lost its cache): the current generation.
            let g = self.gens[i].load(Ordering::Acquire);
            return Some(Registered {
                token: token(i as u32 + 1, g),
                adopted: None,
            });
        }
        // A few passes: a repairer may free dead entries between our two scans (they are
        // then neither free in the first scan nor dead in the second).
        for _ in 0..4 {
            for (i, e) in self.ids.iter().enumerate() {
                if e.load(Ordering::Relaxed) == 0
                    && e.compare_exchange(0, w, Ordering::AcqRel, Ordering::Relaxed)
                        .is_ok()
                {
                    return Some(Registered {
                        token: self.bump(i),
                        adopted: None,
                    });
                }
            }
            for (i, e) in self.ids.iter().enumerate() {
                let old = e.load(Ordering::Acquire);
                if Identity::unpack(old).is_some_and(|o| !liveness::alive(o))
                    && e.compare_exchange(old, w, Ordering::AcqRel, Ordering::Relaxed)
                        .is_ok()
                {
                    let t = self.bump(i);
                    let waits = self.waits[i].swap(0, Ordering::AcqRel);
                    return Some(Registered {
                        token: t,
                        adopted: Some((old, waits)),
                    });
                }
            }
        }
        None
    }

    /// Gives an adopted entry back to the dead identity it had (the adopter could not repair
    /// yet), so that whoever repairs next still sees that party dead. The generation stays
    /// bumped: the adopter's token, and the dead party's, are both stale.
    pub fn give_back(&self, t: u32, mine: u64, was: u64) {
        if let Some(i) = Self::entry(split(t).0) {
            let _ = self.ids[i].compare_exchange(mine, was, Ordering::AcqRel, Ordering::Relaxed);
        }
    }

    /// The identity registered under party number `p` now, if the entry is in use.
    pub fn identity_of(&self, p: u32) -> Option<Identity> {
        Identity::unpack(self.ids[Self::entry(p)?].load(Ordering::Acquire))
    }

    /// The identity that token `t` names, if it is still current (the entry still holds the
    /// registration the token was made for). Reads the generation on both sides of the
    /// identity, so the identity returned is the one registered under `t`'s generation.
    pub fn identity(&self, t: u32) -> Option<Identity> {
        let (p, g) = split(t);
        let i = Self::entry(p)?;
        let current = || self.gens[i].load(Ordering::Acquire) & GEN_MASK == g;
        if !current() {
            return None;
        }
        let id = Identity::unpack(self.ids[i].load(Ordering::Acquire))?;
        current().then_some(id)
    }

    /// Whether token `t` is still its entry's registration (one load, no probe): the
    /// generation moves on whenever an entry is freed or registered.
    pub fn current(&self, t: u32) -> bool {
        let (p, g) = split(t);
        Self::entry(p).is_some_and(|i| self.gens[i].load(Ordering::Acquire) & GEN_MASK == g)
    }

    /// Whether the registration token `t` names is alive. A stale token (its entry freed or
    /// registered again since), a free entry or a number out of range is not.
    pub fn token_alive(&self, t: u32) -> bool {
        self.identity(t).is_some_and(liveness::alive)
    }

    /// Whether token `t` names a party that is gone: stale or free, or its party number is
    /// among `dead` (the numbers of entries found dead by one [`PartyTable::dead`] scan).
    pub fn gone(&self, t: u32, dead: &[(u32, u64)]) -> bool {
        let p = split(t).0;
        self.identity(t).is_none() || dead.iter().any(|&(d, _)| d == p)
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
    /// holds the dead identity `was` (an adopter may have taken it meanwhile). Returns the
    /// sleeping counts it left (to take off the header's totals).
    pub fn free(&self, p: u32, was: u64) -> u32 {
        match Self::entry(p) {
            Some(i)
                if self.ids[i]
                    .compare_exchange(was, 0, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok() =>
            {
                // The freed registration's tokens go stale at once (not only at the next
                // registration): `current` needs one load.
                self.gens[i].fetch_add(1, Ordering::AcqRel);
                // Whoever learns of a death removes the dead party's token (only a genuine,
                // unlocked one: a live process's token is never touched), so tokens of killed
                // processes do not pile up in /dev/shm.
                if let Some(id) = Identity::unpack(was) {
                    liveness::bury(id);
                }
                self.waits[i].swap(0, Ordering::AcqRel)
            }
            _ => 0,
        }
    }

    /// The party of token `t` starts (`+`) or stops sleeping on one side.
    pub fn note_wait(&self, t: u32, side: Side, starts: bool) {
        if let Some(w) = Self::entry(split(t).0).map(|i| &self.waits[i]) {
            if starts {
                w.fetch_add(side.unit(), Ordering::AcqRel);
            } else {
                // Saturating: the entry may have been swapped to 0 by a repair that judged
                // this party dead; never wrap.
                let _ = w.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |v| {
                    let (r, wr) = (v & 0xffff, v >> 16);
                    Some(match side {
                        Side::Reader => (wr << 16) | r.saturating_sub(1),
                        Side::Writer => (wr.saturating_sub(1) << 16) | r,
                    })
                });
            }
        }
    }

    /// Registers a made-up identity (tests: a party that is dead, or never lived); its token.
    #[cfg(test)]
    pub fn register_ghost(&self) -> u32 {
        let me = liveness::me().unwrap();
        self.register(Identity {
            pid: me.pid,
            nonce: me.nonce ^ 0x7777_7777,
        })
        .unwrap()
        .token
    }
}

/// Takes `counts` (a party's sleeping counts, as in `waits`) off the header's totals, never
/// below 0: the totals are hints that lock-free waiters change with atomic adds, so they are
/// corrected by atomic subtraction, never rebuilt by a store.
pub(crate) fn forget_sleepers(readers: &AtomicU32, writers: &AtomicU32, counts: u32) {
    let sub = |a: &AtomicU32, n: u32| {
        if n > 0 {
            let _ = a.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(n))
            });
        }
    };
    sub(readers, counts & 0xffff);
    sub(writers, counts >> 16);
}
