//! Tests of a spinning reader's claim on the next commit (`queue::spinners`).

use super::*;
use crate::wait::monotonic_ns;
use std::sync::mpsc;
use std::thread;

const HOUR: Duration = Duration::from_secs(3600);

fn small() -> Queue {
    let mut q = Queue::create(&QueueConfig {
        ring_bytes: 1 << 14,
        max_messages: 1 << 20,
        max_inline: None,
        side_budget: None,
        pool_bytes: None,
        pool_min: None,
    })
    .unwrap();
    // A claim this handle's commits see stays in force for as long as a test may take to
    // get from making it to the commit: verdicts independent of the machine's load.
    q.set_claim_max(HOUR);
    q
}

fn get(q: &Queue) -> u64 {
    let mut c = q
        .claim(1, Some(Instant::now() + Duration::from_secs(60)))
        .unwrap();
    let seq = c[0].seq;
    q.release(&mut c);
    seq
}

/// A futex waiter on the readers' word, counted as a sleeping reader while it sleeps, that
/// takes nothing: it shows whether a commit woke a sleeper. Returns its thread once it is
/// asleep.
fn sleeper(q: &Arc<Queue>) -> thread::JoinHandle<()> {
    let (tx, rx) = mpsc::channel();
    let seen = q.data_stamp();
    let q2 = q.clone();
    q.hdr().readers_waiting.fetch_add(1, Ordering::SeqCst);
    let t = thread::spawn(move || {
        // SAFETY: gettid takes no arguments and cannot fail.
        tx.send(unsafe { libc::gettid() }).unwrap();
        let h = q2.hdr();
        crate::wait::wait(&h.data_seq.0, seen, Some(Duration::from_secs(60)));
        h.readers_waiting.fetch_sub(1, Ordering::SeqCst);
    });
    crate::wait::until_asleep(rx.recv().unwrap(), || true);
    t
}

#[test]
#[cfg(target_os = "linux")]
fn a_commit_a_spinner_claimed_wakes_no_sleeper_and_the_next_commit_does() {
    let q = Arc::new(small());
    let asleep = sleeper(&q);
    q.claim_spin(HOUR); // a reader spinning for the next commit
    q.put(1, 0, &[b"one"], None).unwrap();
    assert_eq!(q.reader_wakes(), 0, "the claimed commit woke a sleeper");
    assert_eq!(q.spin_claim(), 0, "the commit did not take the claim");
    assert!(!asleep.is_finished(), "the sleeper was woken");
    // The claim was used up: the next commit wakes the sleeper.
    q.put(2, 0, &[b"two"], None).unwrap();
    assert_eq!(q.reader_wakes(), 1);
    asleep.join().unwrap();
    assert_eq!((get(&q), get(&q)), (1, 2));
}

#[test]
#[cfg(target_os = "linux")]
fn a_claim_out_of_force_is_cleared_and_the_commit_wakes_as_before() {
    let q = Arc::new(small());
    let now = monotonic_ns();
    // Ended (a spinner that died or stalled), then too far ahead to be a spin (garbage).
    for (k, claim) in [(1u64, 1u64), (2, now + 2 * HOUR.as_nanos() as u64)] {
        let asleep = sleeper(&q);
        q.set_spin_claim(claim);
        q.put(k, 0, &[b"x"], None).unwrap();
        assert_eq!(q.reader_wakes(), k, "claim {claim}: no sleeper was woken");
        assert_eq!(q.spin_claim(), 0, "claim {claim} was left");
        asleep.join().unwrap();
    }
}

#[test]
fn a_claim_is_in_force_until_it_ends_and_taken_once() {
    let mut q = small();
    q.set_claim_max(Duration::from_millis(1));
    let ms = 1_000_000;
    let t = 10 * ms;
    for (claim, now, in_force) in [
        (0, t, false),          // none
        (t + ms / 2, t, true),  // ends within the window
        (t + ms, t, true),      // at its edge
        (t + ms + 1, t, false), // beyond: no spin announces that
        (t, t, false),          // ended now
        (t - 1, t, false),      // ended
    ] {
        q.set_spin_claim(claim);
        assert_eq!(
            q.take_spin_claim_at(now),
            in_force,
            "claim {claim} at {now}"
        );
        assert_eq!(q.spin_claim(), 0, "claim {claim} not cleared");
        assert!(!q.take_spin_claim_at(now), "claim {claim} taken twice");
    }
}

#[test]
fn a_spinner_withdraws_its_own_claim_only() {
    let q = small();
    let mine = q.claim_spin(Duration::from_millis(1));
    assert!(mine > 0);
    assert_eq!(q.spin_claim(), mine);
    // A later spinner's claim stands when the earlier one's spin ends.
    q.set_spin_claim(mine + 5);
    q.withdraw_spin_claim(mine);
    assert_eq!(q.spin_claim(), mine + 5);
    q.withdraw_spin_claim(mine + 5);
    assert_eq!(q.spin_claim(), 0);
    // A claim a writer took stays taken.
    let mine = q.claim_spin(Duration::from_millis(1));
    assert!(q.take_spin_claim_at(mine - 1));
    q.withdraw_spin_claim(mine);
    assert_eq!(q.spin_claim(), 0);
}

#[test]
fn a_claimed_commit_that_its_spinner_never_reads_still_reaches_a_sleeping_reader() {
    // The claim's reader died (or gave up its read) after the commit took the claim: the
    // sleeping reader is not woken for it, and finds it when its sleep ends (one recovery
    // tick at most), instead of never.
    let q = Arc::new(small());
    let mut q2 = Queue::attach(q.name()).unwrap();
    q2.set_spin(Duration::ZERO); // sleeps at once
    let q2 = Arc::new(q2);
    let (tx, rx) = mpsc::channel();
    let reader = {
        let q2 = q2.clone();
        thread::spawn(move || {
            // SAFETY: gettid takes no arguments and cannot fail.
            tx.send(unsafe { libc::gettid() }).unwrap();
            get(&q2)
        })
    };
    let h = q.hdr();
    crate::wait::until_asleep(rx.recv().unwrap(), || {
        h.readers_waiting.load(Ordering::SeqCst) > 0
    });
    q.set_spin_claim(monotonic_ns() + HOUR.as_nanos() as u64);
    q.put(9, 0, &[b"nine"], None).unwrap();
    assert_eq!(q.reader_wakes(), 0, "the claimed commit woke the sleeper");
    assert_eq!(reader.join().unwrap(), 9);
}

#[test]
fn a_spinning_reader_gets_its_message_and_leaves_no_claim() {
    // A reader that spins for a long time (its claim in force all along) beside a
    // sleeper: the commit is the spinner's. Whether its spin caught the commit or was
    // descheduled first (then it withdrew its claim and the commit woke the sleeper)
    // depends on the machine's load; either way the spinner gets the message, and no
    // claim is left behind.
    let q = Arc::new(small());
    let mut q2 = Queue::attach(q.name()).unwrap();
    q2.set_spin(Duration::from_secs(30));
    q2.set_claim_max(HOUR);
    let q2 = Arc::new(q2);
    let asleep = sleeper(&q);
    let reader = {
        let q2 = q2.clone();
        thread::spawn(move || get(&q2))
    };
    // Until it spins (its claim is there), or it fell asleep (a descheduled spin).
    let h = q.hdr();
    while q.spin_claim() == 0 && h.readers_waiting.load(Ordering::SeqCst) < 2 {
        std::hint::spin_loop();
    }
    q.put(4, 0, &[b"four"], None).unwrap();
    assert_eq!(reader.join().unwrap(), 4);
    assert_eq!(q.spin_claim(), 0);
    if q.reader_wakes() == 0 {
        assert!(!asleep.is_finished(), "a commit woke the sleeper");
    }
    if !asleep.is_finished() {
        q.put(5, 0, &[b"five"], None).unwrap();
    }
    asleep.join().unwrap();
}
