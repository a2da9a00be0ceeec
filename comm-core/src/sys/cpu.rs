//! The CPUs this thread may run on.

/// This thread's affinity mask as bytes (CPU `k` is bit `k % 8` of byte
/// `k / 8`), trailing zero bytes trimmed; empty when the kernel does not
/// say (then nothing is known). Up to 8192 CPUs.
pub fn affinity() -> Vec<u8> {
    let mut words = [0u64; 128];
    // SAFETY: the buffer is writable for its whole size, which is passed;
    // `cpu_set_t` is a plain bit array, so a larger one is read the same.
    let r = unsafe {
        libc::sched_getaffinity(
            0,
            std::mem::size_of_val(&words),
            words.as_mut_ptr() as *mut libc::cpu_set_t,
        )
    };
    if r != 0 {
        return Vec::new();
    }
    let mut bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    while bytes.last() == Some(&0) {
        bytes.pop();
    }
    bytes
}

#[cfg(test)]
mod tests {
    #[test]
    fn this_thread_may_run_somewhere() {
        let mask = super::affinity();
        let cpus: u32 = mask.iter().map(|b| b.count_ones()).sum();
        assert!(cpus >= 1, "{mask:?}");
        // std's count is the mask's, less under a CPU quota.
        assert!(std::thread::available_parallelism().unwrap().get() <= cpus as usize);
    }
}
