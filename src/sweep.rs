//! The sweep: removes from `/dev/shm` the names whose owners are gone.
//!
//! A name lives by its tag ([`crate::shm`]): a process's names while that process lives
//! ([`crate::liveness::owner_dead`]: a missing token alone is no proof of death), a queue's
//! names while any process holds the queue's token ([`crate::liveness::QueueToken`]). The
//! sweep removes only regular files of our uid, never follows a link, never blocks, and runs
//! one liveness verdict per tag.
//!
//! # A queue's names after its last party
//! The last party to leave a queue (or the sweep, once every party is gone) takes the
//! queue's token exclusively ([`crate::liveness::LastHold`]), removes every name with the
//! queue's tag that is in `/dev/shm` (not only those its tables name: a party that died
//! between two steps may have left a name that no table names, such as a slot segment evicted
//! from the table but not yet unlinked) and then the token.
//!
//! A pooled slot's name (`<queue>.<idx>.<gen>.<hash>`, [`crate::slots::slot_name`]) whose
//! queue has neither a token nor its segment any more is removed too: the queue's last party
//! has left, so nobody can map it again. (Such a name can only be made by a process that no
//! longer holds the queue, one that let go of its holds on its way out while another of its
//! threads still wrote.) Other names of a queue with no token are left alone: a token removed
//! by hand from a live queue must not take its segments with it.
//!
//! What a death between two steps leaves: a sweep that dies after removing some of a
//! queue's names and before the token leaves the token unlocked (its lock dies with it), so
//! the next sweep finishes the job; one that dies while removing a dead process's names
//! leaves that process's token, which the next sweep finds unlocked again.

use crate::liveness::{self, QueueTag};
use crate::shm::{owner_of, unlink_name, Owner, NAME_PREFIX};
use std::collections::HashMap;

/// Removes every name in `/dev/shm` owned by `owner` (segments and its token), if `owner` is
/// dead. Returns how many were removed.
pub fn sweep_owner(owner: liveness::Identity) -> usize {
    sweep(|o| o == Owner::Process(owner), Burial::Patient)
}

/// Removes the names of processes with these pids that are dead (any nonce): for a parent that
/// reaped its children, or a child that learned its parent died. Returns how many were
/// removed.
pub fn sweep_pids(pids: &[u32]) -> usize {
    sweep(
        |o| matches!(o, Owner::Process(id) if pids.contains(&id.pid)),
        Burial::Patient,
    )
}

/// How a sweep takes a dead process's token: one try at its lock, or (for a death this
/// process just learned of: see [`liveness::bury_dead`]) asked again for a moment, since the
/// others that learned of it probe or bury the same token at the same time.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Burial {
    OneTry,
    Patient,
}

/// For a process that ends right after (a watchdog before `_exit`): lets go of every queue
/// this process holds and removes the names of those that no process holds any more. Returns
/// how many names were removed.
pub fn leave_queues() -> usize {
    let tags = liveness::release_queue_holds();
    if tags.is_empty() {
        return 0;
    }
    sweep(
        |o| matches!(o, Owner::Queue(t) if tags.contains(&t)),
        Burial::OneTry,
    )
}

/// Removes segments (and liveness tokens) left in `/dev/shm` by owners that are dead, and the
/// names of queues that no process uses any more. Live processes in other PID namespaces that
/// share `/dev/shm` (their tokens are held), names of other formats, and anything that is not
/// a regular file of our uid are left alone. Returns how many were removed.
pub fn sweep_stale() -> usize {
    sweep(|_| true, Burial::OneTry)
}

/// Whether the entry is a regular file of ours (never follows a link).
fn ours(entry: &std::fs::DirEntry) -> bool {
    own_file(entry.metadata())
}

/// Whether these (`lstat`) figures are a regular file's of our uid.
fn own_file(meta: std::io::Result<std::fs::Metadata>) -> bool {
    use std::os::unix::fs::MetadataExt;
    meta.is_ok_and(|m| {
        // SAFETY: geteuid has no preconditions.
        m.file_type().is_file() && m.uid() == unsafe { libc::geteuid() }
    })
}

fn sweep(select: impl Fn(Owner) -> bool, burial: Burial) -> usize {
    let Ok(dir) = std::fs::read_dir(liveness::SHM_DIR) else {
        return 0;
    };
    // One verdict per owner: group the names first.
    let mut groups: HashMap<Owner, Vec<std::fs::DirEntry>> = HashMap::new();
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(owner) = owner_of(name) else {
            continue;
        };
        if select(owner) {
            groups.entry(owner).or_default().push(entry);
        }
    }
    let mut removed = 0;
    let mut unlink_ours = |entries: &[std::fs::DirEntry]| {
        for e in entries {
            let name = e.file_name();
            let name = name.to_string_lossy();
            if !name.ends_with(".live") && ours(e) && unlink_name(&name).is_ok() {
                removed += 1;
            }
        }
    };
    let mut tokens = 0;
    let mut orphans = 0;
    for (owner, entries) in groups {
        match owner {
            Owner::Process(id) => {
                if liveness::owner_dead(id) {
                    unlink_ours(&entries);
                    // The token last, holding its lock (a missing one needs nothing).
                    tokens += usize::from(match burial {
                        Burial::OneTry => liveness::bury(id),
                        Burial::Patient => liveness::bury_dead(id),
                    });
                }
            }
            Owner::Queue(tag) => {
                // Nobody holds the queue's token: take it exclusively and keep it while its
                // names go; the hold removes the token when dropped.
                if let Some(hold) = liveness::LastHold::take(tag) {
                    unlink_ours(&entries);
                    drop(hold);
                    tokens += 1;
                } else {
                    orphans += unlink_orphan_slots(tag, &entries);
                }
            }
        }
    }
    removed + tokens + orphans
}

/// For the last party of queue `tag`, holding its token exclusively: removes every name of
/// the queue in `/dev/shm` but the token (which the hold removes when dropped). Returns how
/// many were removed.
pub fn unlink_queue_names(tag: QueueTag) -> usize {
    let Ok(dir) = std::fs::read_dir(liveness::SHM_DIR) else {
        return 0;
    };
    let mut removed = 0;
    for e in dir.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if owner_of(name) == Some(Owner::Queue(tag))
            && !name.ends_with(".live")
            && ours(&e)
            && unlink_name(name).is_ok()
        {
            removed += 1;
        }
    }
    removed
}

/// Whether `path` (in `/dev/shm`) is a regular file of ours, without following a link.
pub(crate) fn is_ours(path: &str) -> bool {
    own_file(std::fs::symlink_metadata(path))
}

/// The segment name of the queue a pooled slot name belongs to (`<queue>.<idx>.<gen>.<hash>`
/// -> `<queue>`, as a bare name in `/dev/shm`), if `name` has that shape.
fn queue_of_slot(name: &str) -> Option<&str> {
    let parts: Vec<&str> = name.strip_prefix(NAME_PREFIX)?.split('.').collect();
    let hex = |s: &str, max: usize| {
        !s.is_empty() && s.len() <= max && s.bytes().all(|b| b.is_ascii_hexdigit())
    };
    let [_, r, idx, gen, mac] = parts[..] else {
        return None;
    };
    if !(r.len() == 16
        && hex(r, 16)
        && hex(idx, 16)
        && hex(gen, 16)
        && mac.len() == 16
        && hex(mac, 16))
    {
        return None;
    }
    let queue_len = NAME_PREFIX.len() + parts[0].len() + 1 + r.len();
    Some(&name[..queue_len])
}

/// Removes the pooled slot names of queue `tag` (among `entries`, of a listing) when the
/// queue has neither a token of ours nor its segment any more: its last party is gone, so
/// nobody maps them again. Both are checked after the listing: a queue's token and its
/// segment are made before any of its slots, so a slot listed while neither exists any
/// longer belongs to a queue that is over. Returns how many were removed.
fn unlink_orphan_slots(tag: QueueTag, entries: &[std::fs::DirEntry]) -> usize {
    let token = tag.token_path();
    let mut removed = 0;
    for e in entries {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(queue) = queue_of_slot(name) else {
            continue;
        };
        if !is_ours(&token)
            && std::fs::symlink_metadata(format!("{}/{queue}", liveness::SHM_DIR))
                .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
            && ours(e)
            && unlink_name(name).is_ok()
        {
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::liveness::Identity;
    use crate::shm::tests::{exists, plant, remove};
    use crate::shm::{new_name_for, Segment};
    use crate::testing::alone;

    #[test]
    fn sweep_removes_segments_of_dead_owners_only() {
        let _alone = alone();
        let me = liveness::me().unwrap();
        let dead = Identity {
            pid: me.pid,
            nonce: me.nonce ^ 0x0f0f_0f0f,
        };
        let stale = Segment::create(4096, dead).unwrap();
        let live = Segment::create(4096, me).unwrap();
        // An old-format name whose owner cannot be vouched for is never swept.
        let old = Segment::create_named(&format!("/{NAME_PREFIX}{}.abcdef01", i32::MAX - 7), 4096)
            .unwrap();
        // Another sweep (a test beside this one, another process) may take it first: what
        // counts is that the dead owner's segment is gone, not who removed it.
        sweep_stale();
        assert!(Segment::attach(stale.name()).is_err());
        assert!(Segment::attach(live.name()).is_ok());
        assert!(Segment::attach(old.name()).is_ok());
        assert!(liveness::alive(me), "our own token survives the sweep");
    }

    #[test]
    fn the_sweep_keeps_a_queue_s_names_while_a_party_holds_its_token() {
        let _alone = alone();
        let q = liveness::QueueToken::create(liveness::me().unwrap()).unwrap();
        let tag = q.tag().tag();
        let seg = Segment::create_tagged(4096, &tag).unwrap();
        seg.forget_name();
        let name = seg.name().to_owned();
        sweep_stale();
        assert!(Segment::attach(&name).is_ok(), "a held queue's names stay");
        // The last party ends without cleaning up (as if killed). Another process's sweep
        // (any test run on this machine) may take the names first, so what is checked is
        // that they are gone, not what this sweep counted.
        drop(q);
        sweep_stale();
        assert!(Segment::attach(&name).is_err(), "segment removed");
        assert!(!exists(&format!("/ec.{tag}.live")), "token removed");
    }

    #[test]
    fn the_sweep_leaves_other_users_files_and_planted_things() {
        let _alone = alone();
        let me = liveness::me().unwrap();
        let dead = Identity {
            pid: me.pid,
            nonce: me.nonce ^ 0x0f0f_0f0f,
        };
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let mut planted = Vec::new();
        for how in ["fifo", "link", "dir", "foreign"] {
            if how == "foreign" && !root {
                continue;
            }
            let name = new_name_for(dead).unwrap();
            plant(&name, how);
            planted.push(name);
        }
        // A token name planted as a FIFO must not hang the sweep.
        let token = format!("/ec.{}.live", dead.tag());
        plant(&token, "fifo");
        sweep_stale();
        for name in planted.iter().chain([&token]) {
            let path = format!("/dev/shm{name}");
            assert!(
                std::fs::symlink_metadata(&path).is_ok(),
                "{name} was removed by the sweep"
            );
            remove(name);
        }
    }

    /// A file of ours named `name` in `/dev/shm` (a name no table knows, as a death between
    /// two steps would leave).
    fn leave_name(name: &str) {
        let seg = Segment::create_named(name, 4096).unwrap();
        seg.forget_name();
    }

    #[test]
    fn the_sweep_removes_a_slot_name_whose_queue_is_over() {
        let _alone = alone();
        let tag = QueueTag(crate::trust::random_u64().unwrap());
        let queue = format!("/ec.{}.{:016x}", tag.tag(), 0x1234_5678_9abc_def0u64);
        let slot = |idx: u32| format!("{queue}.{idx:x}.1.{:016x}", 0xfeed_f00du64);
        // Neither token nor segment: the slot goes; a name of the queue of another shape
        // (a one-shot segment, or the segment of a queue whose token was removed by hand)
        // stays.
        leave_name(&slot(0));
        let other = format!("/ec.{}.{:016x}", tag.tag(), 0x1111u64);
        leave_name(&other);
        sweep_stale();
        assert!(!exists(&slot(0)), "the orphan slot name stayed");
        assert!(
            exists(&other),
            "a name that may be a live queue's segment was removed"
        );
        // The queue's segment is still there (its token removed by hand): its slots stay.
        leave_name(&queue);
        leave_name(&slot(1));
        sweep_stale();
        assert!(
            exists(&slot(1)),
            "the slot of a queue whose segment exists was removed"
        );
        for n in [slot(1), queue.clone(), other] {
            remove(&n);
        }
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            // Another user's file under a slot's name is never removed, and a token planted
            // by another user keeps no name of ours.
            plant(&slot(2), "foreign");
            leave_name(&slot(3));
            plant(&format!("/ec.{}.live", tag.tag()), "foreign");
            sweep_stale();
            assert!(exists(&slot(2)), "another user's file was removed");
            assert!(!exists(&slot(3)), "a planted token kept an orphan of ours");
            remove(&slot(2));
            remove(&format!("/ec.{}.live", tag.tag()));
        }
        // A held token keeps every name, of any shape.
        let held = liveness::QueueToken::create(liveness::me().unwrap()).unwrap();
        let name = format!("/ec.{}.{:016x}.0.1.{:016x}", held.tag().tag(), 7u64, 9u64);
        leave_name(&name);
        sweep_stale();
        assert!(exists(&name), "a held queue's slot name was removed");
        drop(held);
        sweep_stale();
        assert!(!exists(&name));
    }

    #[test]
    fn slot_names_are_told_from_other_names_of_a_queue() {
        let q = "ec.q0123456789abcdef.0011223344556677";
        assert_eq!(
            queue_of_slot(&format!("{q}.3f.1a.0123456789abcdef")),
            Some(q)
        );
        assert_eq!(queue_of_slot(q), None);
        assert_eq!(queue_of_slot(&format!("{q}.live")), None);
        assert_eq!(queue_of_slot(&format!("{q}.3f.1a.0123")), None);
        assert_eq!(queue_of_slot(&format!("{q}.3g.1a.0123456789abcdef")), None);
        assert_eq!(
            queue_of_slot("ec.q01.0011223344556677.1.1.0123456789abcdef"),
            Some("ec.q01.0011223344556677")
        );
    }

    #[test]
    fn the_last_party_removes_names_that_no_table_names() {
        let _alone = alone();
        let q = crate::queue::Queue::create(&crate::queue::QueueConfig {
            ring_bytes: 4096,
            ..Default::default()
        })
        .unwrap();
        let reader = crate::queue::Queue::attach(q.name()).unwrap();
        let tag = match owner_of(q.name()) {
            Some(Owner::Queue(t)) => t,
            other => panic!("{other:?}"),
        };
        let stray = format!("{}.0.1.{:016x}", q.name(), 5u64);
        leave_name(&stray);
        let one_shot = crate::shm::new_name_like(q.name()).unwrap();
        leave_name(&one_shot);
        drop(q); // the creator, not the last party: names the tables do not know stay
        assert!(exists(&stray) && exists(&one_shot));
        drop(reader); // the last party
        let left: Vec<String> = std::fs::read_dir(liveness::SHM_DIR)
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| owner_of(n) == Some(Owner::Queue(tag)))
            .collect();
        assert!(left.is_empty(), "names left after the last party: {left:?}");
    }
}
