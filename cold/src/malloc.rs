//! Keeps glibc's allocator from giving the buffers of a row group decode back to the kernel
//! after every decode. Decoding allocates buffers of a few MiB each (decompressed pages,
//! Arrow arrays, the rebuilt batches). By default glibc serves an allocation above its mmap
//! threshold (128 KiB at start, raised only as freed chunks teach it, at most 32 MiB) with
//! a fresh mapping, and returns free memory at the top of a thread's heap once it passes
//! the trim threshold; so every decode page-faults and zeroes each page it writes again,
//! and unmaps them after. In release that was most of a decode's time: 170–250 ms for a
//! 32 MiB object (67 MiB rebuilt) against 25–42 ms with the thresholds below, the test's
//! peak RSS 6% higher (253 MB against 238 MB; `cargo test --release -p felix-cold --test
//! cold decode_cost -- --ignored --nocapture`, bench/results/catchup-latency-notes.md).
//!
//! The cost: up to [`TRIM_THRESHOLD`] of free memory may stay with each of the allocator's
//! arenas instead of going back to the kernel at once, so a broker's RSS falls more slowly
//! after a burst of cold reads.

/// Allocations up to this size come from the allocator's heaps, never a mapping of their
/// own (glibc's ceiling for the threshold it adapts by itself).
pub const MMAP_THRESHOLD: usize = 32 << 20;
/// Free memory at the top of a heap beyond this goes back to the kernel.
pub const TRIM_THRESHOLD: usize = 64 << 20;

/// Sets glibc's mmap and trim thresholds for the whole process (see the module
/// documentation). Call once at start-up, before the threads that decode. Returns whether
/// the allocator took them: false on other C libraries, where it does nothing.
pub fn keep_decode_buffers() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let (mmap, trim) = (
            libc::c_int::try_from(MMAP_THRESHOLD).unwrap_or(libc::c_int::MAX),
            libc::c_int::try_from(TRIM_THRESHOLD).unwrap_or(libc::c_int::MAX),
        );
        // SAFETY: mallopt takes two integers and changes allocator parameters only; glibc
        // documents it as safe to call at any time, from any thread.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, mmap) == 1
                && libc::mallopt(libc::M_TRIM_THRESHOLD, trim) == 1
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}
