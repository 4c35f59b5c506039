//! Copying a large message's body into its shared segment: with ordinary stores, or with
//! streaming (non-temporal) stores when the destination has left the caches.
//!
//! An ordinary store to a line that is not cached first reads the line from memory (the core
//! must own it before writing part of it), so a copy into cold memory moves each byte three
//! times: the source read, the destination read, the destination written back. A streaming
//! store writes whole lines without reading them; but into lines that are still cached it is
//! slower than an ordinary store (the lines go out to memory, and the reader fetches them from
//! there). On a 2-vCPU VM, copying 1 MiB into segments last filled 40 messages before took
//! 85–95 µs with ordinary stores and 61–63 with streaming ones (`benches/segment_reuse.py`);
//! glibc's streaming copy into a buffer still cached took 71 µs against 33. glibc's `memcpy`
//! streams only copies larger than a threshold it derives from the cache size the CPU
//! reports, which virtual machines often misreport (that VM reports 256 MiB of shared cache,
//! so glibc streamed no copy below 192 MiB). So the queue decides per copy, by how much it
//! has written since the destination was last filled ([`worth_streaming`]): a pooled segment
//! reused while the reader keeps up is still cached, one that comes round again after dozens
//! of results in flight is not.
//!
//! Ordering: streaming stores are weakly ordered, so [`copy`] ends a streamed copy with a
//! store fence: the body is visible to every process before any later store of the writer,
//! such as the commit that publishes the message.

/// Bodies shorter than this (ring records, small side bodies) are copied with ordinary
/// stores.
pub const STREAM_MIN: u64 = 256 << 10;

/// A destination counts as out of the caches once this many bytes were written to the queue
/// since it was last filled (its previous body included), and a body this long streams in
/// any case (copying it evicts its own beginning from a cache of that size). About the
/// share of a last-level cache that one 2-vCPU VM keeps warm (a copy into 1 MiB
/// destinations taken in turn ran at the cached speed up to 4 MiB of them, at the cold one
/// from 16 MiB).
pub const COLD_AFTER: u64 = 16 << 20;

/// Whether a body of `len` bytes, going where the queue last wrote `since_filled` bytes ago,
/// is best copied with streaming stores.
pub fn worth_streaming(len: u64, since_filled: u64) -> bool {
    len >= STREAM_MIN && (since_filled >= COLD_AFTER || len >= COLD_AFTER)
}

/// Copies `len` bytes from `src` to `dst`; with `stream`, by streaming stores where the
/// machine has them (x86-64; elsewhere ordinary stores), fenced (see the module).
///
/// # Safety
/// `src` must be readable and `dst` writable for `len` bytes, and the ranges must not
/// overlap.
pub unsafe fn copy(dst: *mut u8, src: *const u8, len: usize, stream: bool) {
    #[cfg(target_arch = "x86_64")]
    if stream {
        // SAFETY: the caller's contract, passed on.
        unsafe { copy_streaming(dst, src, len) };
        return;
    }
    let _ = stream;
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
}

/// The streamed copy: ordinary stores up to `dst`'s first 64-byte boundary and after its
/// last whole line, SSE2 streaming stores (part of every x86-64) for the lines between,
/// then a store fence.
///
/// # Safety
/// As [`copy`].
#[cfg(target_arch = "x86_64")]
unsafe fn copy_streaming(dst: *mut u8, src: *const u8, len: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    let head = dst.align_offset(64).min(len);
    // SAFETY: `head <= len`: within both ranges.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
    let mut i = head;
    while i + 64 <= len {
        // SAFETY: bytes `i..i + 64` lie within both ranges; `dst + i` is 64-byte aligned
        // (`head` aligned it and `i` grows by 64), as `_mm_stream_si128` needs 16; the loads
        // are unaligned ones.
        unsafe {
            let s = src.add(i) as *const __m128i;
            let d = dst.add(i) as *mut __m128i;
            let a = _mm_loadu_si128(s);
            let b = _mm_loadu_si128(s.add(1));
            let c = _mm_loadu_si128(s.add(2));
            let e = _mm_loadu_si128(s.add(3));
            _mm_stream_si128(d, a);
            _mm_stream_si128(d.add(1), b);
            _mm_stream_si128(d.add(2), c);
            _mm_stream_si128(d.add(3), e);
        }
        i += 64;
    }
    // SAFETY: bytes `i..len` lie within both ranges. The fence orders the streaming stores
    // before every later store of this thread (SSE2, present on every x86-64).
    unsafe {
        std::ptr::copy_nonoverlapping(src.add(i), dst.add(i), len - i);
        _mm_sfence();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_long_bodies_or_long_gone_destinations_stream() {
        assert!(!worth_streaming(STREAM_MIN - 1, u64::MAX));
        assert!(!worth_streaming(STREAM_MIN, COLD_AFTER - 1));
        assert!(worth_streaming(STREAM_MIN, COLD_AFTER));
        assert!(worth_streaming(COLD_AFTER, 0));
    }

    #[test]
    fn a_streamed_copy_equals_the_source_at_every_offset_and_length() {
        // Every alignment of the destination and source, lengths around the line size and
        // the ends of the bulk loop; bytes just outside the destination stay untouched.
        let src: Vec<u8> = (0..1024u32).map(|i| (i * 7 + 3) as u8).collect();
        for dst_off in 0..64 {
            for src_off in [0, 1, 15, 16, 33] {
                for len in [0, 1, 63, 64, 65, 127, 128, 129, 500, 700] {
                    let mut dst = vec![0xAAu8; 1024 + 128];
                    // SAFETY: `src_off + len <= 733 < 1024` and `dst_off + len < 1152`; two
                    // separate vectors.
                    unsafe {
                        copy(
                            dst.as_mut_ptr().add(dst_off),
                            src.as_ptr().add(src_off),
                            len,
                            true,
                        )
                    };
                    assert_eq!(&dst[dst_off..dst_off + len], &src[src_off..src_off + len]);
                    assert!(dst[..dst_off].iter().all(|&b| b == 0xAA));
                    assert!(dst[dst_off + len..].iter().all(|&b| b == 0xAA));
                }
            }
        }
    }
}
