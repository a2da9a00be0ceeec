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

/// The CPUs of this thread's affinity mask, lowest first (empty when the
/// kernel does not say).
pub fn allowed_cpus() -> Vec<usize> {
    affinity()
        .iter()
        .enumerate()
        .flat_map(|(i, b)| {
            (0..8)
                .filter(move |k| b & (1 << k) != 0)
                .map(move |k| i * 8 + k)
        })
        .collect()
}

/// Restrict the calling thread, and every thread and process it starts
/// later, to CPU `cpu` (below 8192). Allocates nothing and makes one
/// system call, so a child may call it between fork and exec.
pub fn bind_to_cpu(cpu: usize) -> std::io::Result<()> {
    let mut words = [0u64; 128];
    if cpu >= words.len() * 64 {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    words[cpu / 64] = 1 << (cpu % 64);
    // SAFETY: the buffer is a readable bit array of the size passed, the
    // layout of `cpu_set_t` (a larger set is read the same).
    let r = unsafe {
        libc::sched_setaffinity(
            0,
            std::mem::size_of_val(&words),
            words.as_ptr() as *const libc::cpu_set_t,
        )
    };
    super::cvt(r).map(|_| ())
}

/// The size of the last-level cache of the first CPU this thread may run
/// on (the largest of its highest level, as the kernel reports it under
/// `/sys/devices/system/cpu/cpuN/cache`); `None` when the kernel does not
/// say. (Not `sysconf`: glibc asks the CPU, which inside a virtual machine
/// may describe the host's cache rather than the share the guest sees,
/// 64 MiB against the kernel's 8 MiB on one.)
pub fn last_level_cache() -> Option<usize> {
    let mask = affinity();
    let cpu = mask
        .iter()
        .enumerate()
        .find(|(_, b)| **b != 0)
        .map_or(0, |(i, b)| i * 8 + b.trailing_zeros() as usize);
    let dir = std::fs::read_dir(format!("/sys/devices/system/cpu/cpu{cpu}/cache")).ok()?;
    dir.flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("index"))
        .filter_map(|e| {
            let read = |f: &str| std::fs::read_to_string(e.path().join(f)).ok();
            if read("type")?.trim() == "Instruction" {
                return None;
            }
            let level: u32 = read("level")?.trim().parse().ok()?;
            // sysfs writes sizes as `512K`, `32M`.
            Some((level, crate::config::parse_bytes(&read("size")?)?))
        })
        .max()
        .map(|(_, size)| size)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_last_level_cache_is_at_least_a_first_level_one() {
        // Where the kernel says nothing (some containers) there is nothing
        // to check.
        if let Some(b) = super::last_level_cache() {
            assert!(b >= 4 << 10, "{b}");
        }
    }

    #[test]
    fn a_thread_bound_to_a_cpu_runs_there_alone() {
        let cpus = super::allowed_cpus();
        let last = *cpus.last().expect("some CPU");
        // On a thread of its own: the test harness's threads keep theirs.
        std::thread::spawn(move || {
            super::bind_to_cpu(last).unwrap();
            assert_eq!(super::allowed_cpus(), vec![last]);
        })
        .join()
        .unwrap();
        assert!(super::bind_to_cpu(1 << 20).is_err());
    }

    #[test]
    fn this_thread_may_run_somewhere() {
        let mask = super::affinity();
        let cpus: u32 = mask.iter().map(|b| b.count_ones()).sum();
        assert!(cpus >= 1, "{mask:?}");
        // std's count is the mask's, less under a CPU quota.
        assert!(std::thread::available_parallelism().unwrap().get() <= cpus as usize);
    }
}
