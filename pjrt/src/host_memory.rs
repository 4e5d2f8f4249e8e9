//! Host allocator tuning for large transfers.
//!
//! On the CPU plugin a host-to-device copy allocates the device buffer with
//! the C allocator. glibc serves allocations above 32 MiB with a fresh
//! `mmap` and returns them to the kernel on free, so every large transfer
//! page-faults its whole destination: measured here, a 64 MiB host-to-device
//! copy took 46 ms instead of 8.7 ms. [`retain_large_allocations`] keeps such
//! blocks in the heap for reuse, trading resident memory for transfer speed,
//! as the pooled host allocators of GPU runtimes do. It changes the whole
//! process, so it is opt-in: the `tessel` binary calls it at start-up.

/// Makes glibc serve large allocations from the heap and keep freed memory
/// for reuse. Returns whether both settings were accepted; a no-op that
/// returns false on other C libraries.
pub fn retain_large_allocations() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        const LIMIT: libc::c_int = 1 << 30;
        // SAFETY: mallopt only adjusts allocator parameters; it is safe to
        // call at any time from any thread.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, LIMIT) == 1
                && libc::mallopt(libc::M_TRIM_THRESHOLD, LIMIT) == 1
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// Below this a buffer is not worth a system call: it cannot hold more than
/// one aligned huge page.
const HUGE_PAGE: usize = 2 << 20;

/// Asks Linux to back the not-yet-touched memory `region` with transparent
/// huge pages (`madvise(MADV_HUGEPAGE)` on the 2 MiB-aligned interior), for
/// a large buffer about to be filled once: one fault per 2 MiB instead of
/// one per 4 KiB page. With `transparent_hugepage=madvise` (the usual
/// default) faulting in a fresh 1 GiB receive buffer was a third of a
/// QUIC transfer's CPU time here. Contents are unaffected; returns whether
/// the kernel took the advice (false on other systems, for regions without
/// a whole aligned huge page, or where huge pages are disabled).
pub fn advise_huge_pages(region: &[std::mem::MaybeUninit<u8>]) -> bool {
    let start = region.as_ptr() as usize;
    let aligned = start.next_multiple_of(HUGE_PAGE);
    let end = (start + region.len()) / HUGE_PAGE * HUGE_PAGE;
    if end <= aligned {
        return false;
    }
    #[cfg(target_os = "linux")]
    {
        // SAFETY: MADV_HUGEPAGE only changes how the kernel backs the pages
        // of [aligned, end), which lies inside `region`, memory this process
        // owns (the borrow keeps it alive for the call); it never changes
        // their contents or mappings, and fails harmlessly (EINVAL) where
        // huge pages are unsupported.
        unsafe {
            libc::madvise(
                aligned as *mut libc::c_void,
                end - aligned,
                libc::MADV_HUGEPAGE,
            ) == 0
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_page_advice_covers_only_whole_aligned_pages_and_keeps_contents() {
        // Shorter than a huge page: never holds a whole aligned one.
        let mut small: Vec<u8> = Vec::with_capacity(HUGE_PAGE);
        assert!(!advise_huge_pages(
            &small.spare_capacity_mut()[..HUGE_PAGE - 1]
        ));

        let mut big: Vec<u8> = Vec::with_capacity(8 * HUGE_PAGE);
        // Whether the kernel takes it depends on its settings; the call
        // must be harmless either way and the buffer usable afterwards.
        let _ = advise_huge_pages(big.spare_capacity_mut());
        big.extend((0..8 * HUGE_PAGE).map(|i| i as u8));
        assert!(big.iter().enumerate().all(|(i, &b)| b == i as u8));
    }
}
