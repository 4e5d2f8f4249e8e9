//! Host memory tuning for large transfers: the allocator, huge pages and
//! streaming copies.
//!
//! On the CPU plugin a host-to-device copy allocates the device buffer with
//! the C allocator. glibc serves allocations above 32 MiB with a fresh
//! `mmap` and returns them to the kernel on free, so every large transfer
//! page-faults its whole destination (docs/performance.md has the cost).
//! [`retain_large_allocations`] keeps such
//! blocks in the heap for reuse, trading resident memory for transfer speed,
//! as the pooled host allocators of GPU runtimes do. It changes the whole
//! process, so it is opt-in: the `tessel` binary calls it at start-up.

// One of the two modules of this crate with `unsafe`: allocator settings
// (`mallopt`), `madvise`, and SSE2 non-temporal stores.
#![allow(unsafe_code)]

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

/// Copies `src` into `dst` (equal lengths, else a panic) with
/// non-temporal stores on x86-64, a plain copy elsewhere.
///
/// For large copies whose destination this core does not read again soon:
/// a plain store first reads each destination line into the cache (a read
/// for ownership) and later writes it back, three bytes of memory traffic
/// per byte copied; a streaming store writes the line straight to memory,
/// two. glibc's `memcpy` streams only above `x86_non_temporal_threshold`,
/// three quarters of what it takes the shared cache to be (192 MiB on this
/// project's 2-core machine, above any collective's copy). The stores are
/// fenced before returning, so a later store (say, the message that tells
/// another process the bytes are there) cannot overtake them.
pub fn copy_streaming(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "a copy between equal lengths");
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        // Plain copies for the head up to the first 64-byte-aligned
        // destination byte and for the tail; 64-byte blocks of SSE2
        // streaming stores (SSE2 is part of x86-64) between them.
        const BLOCK: usize = 64;
        let head = dst.as_ptr().align_offset(BLOCK).min(dst.len());
        let (dst_head, dst_rest) = dst.split_at_mut(head);
        let (src_head, src_rest) = src.split_at(head);
        dst_head.copy_from_slice(src_head);
        let mut dst_blocks = dst_rest.chunks_exact_mut(BLOCK);
        let mut src_blocks = src_rest.chunks_exact(BLOCK);
        for (d, s) in (&mut dst_blocks).zip(&mut src_blocks) {
            let (d, s) = (
                d.as_mut_ptr().cast::<__m128i>(),
                s.as_ptr().cast::<__m128i>(),
            );
            // SAFETY: `d` and `s` each point to 64 bytes of their slices
            // (`chunks_exact`), apart (`&mut` against `&`); the loads are
            // unaligned loads, and every store address is 16-byte aligned
            // because each destination block starts 64-byte aligned (the
            // head above).
            unsafe {
                let (a, b) = (_mm_loadu_si128(s), _mm_loadu_si128(s.add(1)));
                let (c, e) = (_mm_loadu_si128(s.add(2)), _mm_loadu_si128(s.add(3)));
                _mm_stream_si128(d, a);
                _mm_stream_si128(d.add(1), b);
                _mm_stream_si128(d.add(2), c);
                _mm_stream_si128(d.add(3), e);
            }
        }
        dst_blocks
            .into_remainder()
            .copy_from_slice(src_blocks.remainder());
        // SAFETY: a store fence; no operands.
        unsafe { _mm_sfence() };
    }
    #[cfg(not(target_arch = "x86_64"))]
    dst.copy_from_slice(src);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streaming_copies_equal_their_source_at_every_alignment_and_length() {
        let len = (1 << 20) + 200;
        let src: Vec<u8> = (0..len + 64).map(|i| (i * 7 + i / 251) as u8).collect();
        for (src_at, dst_at, trim) in [
            (0, 0, 0),
            (1, 0, 63),
            (0, 5, 1),
            (13, 37, 100),
            (63, 1, 64),
            (0, 0, len - 70),
            (3, 9, len),
        ] {
            let n = len - trim;
            let mut dst = vec![0xAAu8; n + 128];
            copy_streaming(&mut dst[dst_at..dst_at + n], &src[src_at..src_at + n]);
            assert!(dst[..dst_at].iter().all(|&b| b == 0xAA), "nothing before");
            assert_eq!(&dst[dst_at..dst_at + n], &src[src_at..src_at + n]);
            assert!(
                dst[dst_at + n..].iter().all(|&b| b == 0xAA),
                "nothing after"
            );
        }
    }

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
