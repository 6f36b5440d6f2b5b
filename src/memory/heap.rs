//! Giving freed heap back to the operating system.

/// Hands the allocator's free pages back to the OS. glibc keeps what a
/// burst of allocations freed (a full refresh of a million rows, the JSON
/// of a plan snapshot) in its arenas, so without this the process's RSS
/// stays at the burst's peak for good, and RSS is what the memory guard,
/// the kernel and the operator see. A no-op elsewhere.
pub fn release_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks glibc's own arenas under their locks.
    unsafe {
        libc::malloc_trim(0);
    }
}
