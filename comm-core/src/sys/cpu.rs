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

/// Whether this CPU has `prefetchw` (fetch a line in anticipation of a
/// write, taking it from other cores' caches): CPUID's 3DNowPrefetch bit,
/// which AMD's processors since K10 and Intel's since Broadwell set.
pub fn prefetches_for_write() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::__cpuid;
        // Leaf 0x8000_0000 says how many extended leaves there are.
        let max = __cpuid(0x8000_0000).eax;
        max >= 0x8000_0001 && __cpuid(0x8000_0001).ecx & (1 << 8) != 0
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Start taking the cache line at `addr` into this core's cache for
/// writing (a hint: nothing is read or written, and no address faults).
///
/// # Safety
///
/// [`prefetches_for_write`] said this CPU has the instruction.
#[inline(always)]
pub unsafe fn prefetch_for_write(addr: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads and writes nothing and never faults, whatever
    // the address; the caller checked that the CPU has the instruction.
    unsafe {
        std::arch::asm!("prefetchw [{0}]", in(reg) addr, options(nostack, readonly, preserves_flags))
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}

/// Start fetching the cache line at `addr` into this core's cache (a
/// hint: nothing is read).
#[inline(always)]
pub fn prefetch_for_read(addr: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing and never faults, whatever the address.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(addr as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}

#[cfg(test)]
mod tests {
    #[test]
    fn prefetching_for_write_is_found_where_linux_lists_it_and_never_faults() {
        // Linux names CPUID's bit `3dnowprefetch` in its flags.
        let listed = std::fs::read_to_string("/proc/cpuinfo")
            .map(|s| s.split_whitespace().any(|w| w == "3dnowprefetch"))
            .unwrap_or(false);
        let has = super::prefetches_for_write();
        if cfg!(target_arch = "x86_64") && std::path::Path::new("/proc/cpuinfo").exists() {
            assert_eq!(has, listed);
        }
        let line = [0u8; 64];
        super::prefetch_for_read(line.as_ptr());
        super::prefetch_for_read(std::ptr::null());
        if has {
            // SAFETY: the CPU has the instruction (above).
            unsafe {
                super::prefetch_for_write(line.as_ptr());
                super::prefetch_for_write(std::ptr::null());
            }
        }
    }

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
