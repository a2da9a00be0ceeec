//! The registration cache: memory registered once (pinned, with a key the
//! device knows) and reused by every send that falls inside it, until it is
//! unregistered.
//!
//! Only memory whose lifetime oxccl knows enters the cache: `comm-core`
//! registers a `SharedBuffer` when it is allocated and unregisters it when
//! it is dropped. Arbitrary user pointers are *not* cached automatically: a
//! freed and reallocated address would still map to the old, pinned pages
//! (the classic stale-registration bug, which other libraries avoid only by
//! intercepting `munmap`). Plain buffers go through the bounce slots instead.
//!
//! The cache is generic over the region type so its bookkeeping is tested
//! without a device.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

struct Entry<R> {
    len: usize,
    refs: u32,
    region: Arc<R>,
}

/// Registered ranges by start address.
pub struct RegCache<R> {
    map: Mutex<BTreeMap<usize, Entry<R>>>,
    /// Ranges registered (written under the lock): every large send looks
    /// up the cache, and most jobs register nothing, so an empty cache
    /// answers without taking the lock.
    ranges: AtomicUsize,
}

impl<R> Default for RegCache<R> {
    fn default() -> Self {
        RegCache {
            map: Mutex::new(BTreeMap::new()),
            ranges: AtomicUsize::new(0),
        }
    }
}

impl<R> RegCache<R> {
    /// Register `[addr, addr+len)`: the same range again only counts a
    /// reference; a new range calls `register` once. Ranges may not
    /// partially overlap an existing one (two buffers never do).
    pub fn insert<E>(
        &self,
        addr: usize,
        len: usize,
        register: impl FnOnce() -> Result<R, E>,
    ) -> Result<(), InsertError<E>> {
        let mut map = self.map.lock().unwrap();
        if let Some(e) = map.get_mut(&addr) {
            if e.len == len {
                e.refs += 1;
                return Ok(());
            }
        }
        let end = addr.checked_add(len).ok_or(InsertError::Overlap)?;
        let before = map.range(..end).next_back();
        if let Some((&a, e)) = before {
            if a + e.len > addr {
                return Err(InsertError::Overlap);
            }
        }
        let region = register().map_err(InsertError::Register)?;
        map.insert(
            addr,
            Entry {
                len,
                refs: 1,
                region: Arc::new(region),
            },
        );
        self.ranges.store(map.len(), Ordering::Release);
        Ok(())
    }

    /// Drop one reference to exactly this range; the region is released
    /// (deregistered) with the last one, once no send still holds it.
    /// Returns whether the range was registered.
    pub fn remove(&self, addr: usize, len: usize) -> bool {
        let mut map = self.map.lock().unwrap();
        match map.get_mut(&addr) {
            Some(e) if e.len == len => {
                e.refs -= 1;
                if e.refs == 0 {
                    map.remove(&addr);
                    self.ranges.store(map.len(), Ordering::Release);
                }
                true
            }
            _ => false,
        }
    }

    /// The region containing all of `[addr, addr+len)`, if registered.
    pub fn lookup(&self, addr: usize, len: usize) -> Option<Arc<R>> {
        if self.ranges.load(Ordering::Acquire) == 0 {
            return None;
        }
        let map = self.map.lock().unwrap();
        let (&a, e) = map.range(..=addr).next_back()?;
        (addr + len <= a + e.len).then(|| e.region.clone())
    }

    /// Number of registered ranges.
    pub fn len(&self) -> usize {
        self.ranges.load(Ordering::Acquire)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Why a range could not be added.
#[derive(Debug)]
pub enum InsertError<E> {
    /// It partially overlaps a registered range.
    Overlap,
    /// The device refused the registration.
    Register(E),
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A fake region that counts registrations alive.
    struct Fake(u32, Arc<AtomicU32>);
    impl Drop for Fake {
        fn drop(&mut self) {
            self.1.fetch_sub(1, Ordering::SeqCst);
        }
    }

    fn reg(alive: &Arc<AtomicU32>, key: u32) -> impl FnOnce() -> Result<Fake, ()> + '_ {
        move || {
            alive.fetch_add(1, Ordering::SeqCst);
            Ok(Fake(key, alive.clone()))
        }
    }

    #[test]
    fn registers_once_and_finds_ranges_inside() {
        let alive = Arc::new(AtomicU32::new(0));
        let c = RegCache::default();
        c.insert(1000, 100, reg(&alive, 7)).unwrap();
        c.insert(1000, 100, || -> Result<Fake, ()> {
            panic!("registered twice")
        })
        .unwrap();
        assert_eq!(alive.load(Ordering::SeqCst), 1);
        assert_eq!(c.lookup(1000, 100).unwrap().0, 7);
        assert_eq!(c.lookup(1050, 50).unwrap().0, 7);
        assert!(c.lookup(1050, 51).is_none(), "runs past the end");
        assert!(c.lookup(999, 2).is_none(), "starts before");
        assert!(c.lookup(5000, 1).is_none());
        c.insert(2000, 10, reg(&alive, 8)).unwrap();
        assert_eq!(c.lookup(2000, 10).unwrap().0, 8);
        assert_eq!(c.lookup(1099, 1).unwrap().0, 7);
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn unregister_invalidates_after_the_last_reference_and_the_last_user() {
        let alive = Arc::new(AtomicU32::new(0));
        let c = RegCache::default();
        c.insert(0x1000, 4096, reg(&alive, 1)).unwrap();
        c.insert(0x1000, 4096, reg(&alive, 1)).unwrap();
        assert!(c.remove(0x1000, 4096));
        assert!(c.lookup(0x1000, 8).is_some(), "one registration left");
        let held = c.lookup(0x1000, 8).unwrap(); // a send in flight
        assert!(c.remove(0x1000, 4096));
        assert!(c.lookup(0x1000, 8).is_none(), "invalidated");
        assert_eq!(
            alive.load(Ordering::SeqCst),
            1,
            "kept while a send holds it"
        );
        drop(held);
        assert_eq!(alive.load(Ordering::SeqCst), 0, "released");
        assert!(!c.remove(0x1000, 4096), "already gone");
        assert!(c.is_empty());
    }

    #[test]
    fn overlaps_and_failures_are_refused_without_changing_anything() {
        let alive = Arc::new(AtomicU32::new(0));
        let c = RegCache::default();
        c.insert(100, 100, reg(&alive, 1)).unwrap();
        assert!(matches!(
            c.insert(150, 100, reg(&alive, 2)),
            Err(InsertError::Overlap)
        ));
        assert!(matches!(
            c.insert(50, 51, reg(&alive, 2)),
            Err(InsertError::Overlap)
        ));
        assert!(matches!(
            c.insert(100, 50, reg(&alive, 2)),
            Err(InsertError::Overlap)
        ));
        assert!(matches!(
            c.insert(usize::MAX - 1, 10, reg(&alive, 2)),
            Err(InsertError::Overlap)
        ));
        let r: Result<(), InsertError<&str>> = c.insert(300, 10, || Err("no memory"));
        assert!(matches!(r, Err(InsertError::Register("no memory"))));
        c.insert(200, 100, reg(&alive, 3)).unwrap(); // adjacent is fine
        assert_eq!(alive.load(Ordering::SeqCst), 2);
        assert_eq!(c.len(), 2);
    }
}
