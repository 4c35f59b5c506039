//! The process heap's malloc thresholds (glibc's `mallopt`), for processes that make a
//! fresh array per item and drop it once it is sent: easycore's producers.
//!
//! glibc serves an allocation above its mmap threshold with a fresh mapping, and gives the
//! top of the heap back to the kernel once more than its trim threshold is free there. Both
//! thresholds start low (128 KiB) and adapt upwards only as mapped chunks are freed, the
//! trim threshold to twice the mmap one. A producer that makes four 256 KiB arrays a batch
//! and frees them together frees 1 MiB at the top of its heap each time, above the adapted
//! trim threshold: the heap shrinks and grows again at every batch, and each array's 64
//! pages are faulted in anew (about 45 us of a 256 KiB array's 55 us on a 2-core VM).
//! [`set_malloc_thresholds`] puts both where glibc's own adaptation would end (32 MiB and
//! 64 MiB): arrays up to 32 MiB come from the heap and are reused, and a process keeps up to
//! 64 MiB of freed memory for the next batch.

/// Sets glibc's mmap threshold to `mmap` bytes and its trim threshold to `trim` bytes for
/// this process; false where the C library has no `mallopt` (not glibc) or refused a value.
pub fn set_malloc_thresholds(mmap: u32, trim: u32) -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let (Ok(mmap), Ok(trim)) = (libc::c_int::try_from(mmap), libc::c_int::try_from(trim))
        else {
            return false;
        };
        // SAFETY: mallopt only sets two integers of the allocator's state, under its own lock;
        // it takes no pointers.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, mmap) == 1
                && libc::mallopt(libc::M_TRIM_THRESHOLD, trim) == 1
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        let _ = (mmap, trim);
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glibc_takes_thresholds_up_to_its_own_maximum() {
        // glibc's adaptive maximum for 64-bit; it changes only how this test process's heap
        // keeps and maps memory.
        assert!(set_malloc_thresholds(32 << 20, 64 << 20));
    }

    #[test]
    fn a_value_past_a_c_int_is_refused() {
        assert!(!set_malloc_thresholds(u32::MAX, 64 << 20));
    }
}
