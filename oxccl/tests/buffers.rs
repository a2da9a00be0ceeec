//! Buffers that are not `Vec`s: a framework's own storage type goes through
//! every kind of call via the `Buffer` traits, and memory no engine of this
//! build can reach is refused before anything is sent.

mod common;

use common::*;
use oxccl::prelude::*;
use oxccl::{Buffer, BufferMut, DeviceKind, MemorySpace, Region};
use std::alloc::{alloc_zeroed, dealloc, Layout};

/// A tensor's storage as a training framework might own it: raw,
/// 64-byte aligned memory from the global allocator, not a `Vec`.
struct Storage {
    ptr: *mut f32,
    len: usize,
}

// SAFETY: the storage owns its memory exclusively.
unsafe impl Send for Storage {}

impl Storage {
    fn new(len: usize, fill: f32) -> Storage {
        let ptr = if len == 0 {
            std::ptr::NonNull::<f32>::dangling().as_ptr()
        } else {
            // SAFETY: non-zero size, valid layout; zeroed f32s are valid.
            unsafe { alloc_zeroed(Self::layout(len)) as *mut f32 }
        };
        let mut s = Storage { ptr, len };
        s.as_mut().fill(fill);
        s
    }
    fn layout(len: usize) -> Layout {
        Layout::from_size_align(len * 4, 64).unwrap()
    }
    fn as_ref(&self) -> &[f32] {
        // SAFETY: `len` initialised f32s owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    fn as_mut(&mut self) -> &mut [f32] {
        // SAFETY: as above, exclusively.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: allocated in `new` with this layout.
            unsafe { dealloc(self.ptr as *mut u8, Self::layout(self.len)) }
        }
    }
}

// SAFETY: describes exactly the owned, initialised, aligned elements,
// valid while `self` is borrowed.
unsafe impl Buffer<f32> for Storage {
    fn region(&self) -> Region {
        Region {
            space: MemorySpace::Host,
            addr: self.ptr as usize,
            len: self.len * 4,
        }
    }
}

// SAFETY: as above; `&mut self` is exclusive.
unsafe impl BufferMut<f32> for Storage {
    fn region_mut(&mut self) -> Region {
        self.region()
    }
}

#[test]
fn user_storage_through_sync_and_async_calls() {
    with_ranks(3, test_config(), |c| {
        let (r, n) = (c.rank() as f32, c.nranks());
        for len in [0, 1, 1000, 300_001] {
            // Out of place and in place, blocking.
            let send = Storage::new(len, r + 1.0);
            let mut recv = Storage::new(len, -1.0);
            c.all_reduce(&send, &mut recv, ReduceOp::Sum).unwrap();
            assert!(recv.as_ref().iter().all(|v| *v == 6.0), "len {len}");
            let mut t = Storage::new(len, r);
            c.all_reduce_in_place(&mut t, ReduceOp::Max).unwrap();
            assert!(t.as_ref().iter().all(|v| *v == 2.0));
            // Async: the storage itself is moved in and handed back.
            let addr = t.ptr;
            let back = c.all_reduce_async(t, ReduceOp::Sum).wait().unwrap();
            assert_eq!(back.ptr, addr, "the same storage comes back, not a copy");
            assert!(back.as_ref().iter().all(|v| *v == 6.0));
            // Out-of-place async with two storages.
            let s = Storage::new(len, r);
            let g = Storage::new(len * n, 0.0);
            let (_, g) = c.all_gather_async(s, g).wait().unwrap();
            for (i, v) in g.as_ref().iter().enumerate() {
                assert_eq!(*v, (i / len.max(1)) as f32);
            }
        }
    });
}

/// Storage claiming to be device memory: the host engine cannot reach it.
struct DeviceStorage(Region);

// SAFETY: never dereferenced: the call refuses it first (what the test shows).
unsafe impl Buffer<f32> for DeviceStorage {
    fn region(&self) -> Region {
        self.0
    }
}
// SAFETY: as above.
unsafe impl BufferMut<f32> for DeviceStorage {
    fn region_mut(&mut self) -> Region {
        self.0
    }
}

#[test]
fn device_memory_without_a_device_engine_is_refused_and_the_communicator_stays_usable() {
    with_ranks(2, test_config(), |c| {
        let mut d = DeviceStorage(Region {
            space: MemorySpace::Device {
                kind: DeviceKind::Cuda,
                ordinal: 0,
            },
            addr: 0x7000_0000_0000,
            len: 4096,
        });
        let e = c.all_reduce_in_place(&mut d, ReduceOp::Sum).unwrap_err();
        assert!(matches!(e, Error::Unsupported(_)), "{e:?}");
        assert!(e.to_string().contains("Cuda device 0"), "{e}");
        assert!(c.error().is_none(), "an unsupported buffer poisons nothing");
        let mut v = vec![1u8; 10];
        c.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
        assert_eq!(v, vec![2u8; 10]);
    });
}
