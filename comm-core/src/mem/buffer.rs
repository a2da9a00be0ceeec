//! The buffer traits every call takes: slices, `Vec`s, boxed slices,
//! arrays, [`SharedBuffer`]s and any user storage (a framework's tensor
//! storage, later device slices) that can describe its memory as a
//! [`Region`].

use super::{Region, SharedBuffer};
use crate::types::Element;

/// Memory holding `len()` elements of `T` that a call may read.
///
/// # Safety
/// `region()` must describe memory that holds `region().len /
/// size_of::<T>()` initialised elements of `T`, aligned for `T`, that stays
/// valid and is not written by anyone else for as long as `self` is
/// borrowed. (Owned buffers of async calls are moved into the call first;
/// the region is taken only after that move, so storage that moves with
/// its value, like an array, is fine.)
pub unsafe trait Buffer<T: Element> {
    /// The memory, in bytes.
    fn region(&self) -> Region;
    /// Elements held.
    fn len(&self) -> usize {
        self.region().len / std::mem::size_of::<T>()
    }
    /// Whether it holds no element.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A [`Buffer`] a call may also write.
///
/// # Safety
/// As [`Buffer`], and `region_mut()` must be the same memory, which nobody
/// else reads or writes while `self` is mutably borrowed.
pub unsafe trait BufferMut<T: Element>: Buffer<T> {
    /// The memory, in bytes, writable.
    fn region_mut(&mut self) -> Region;
}

// SAFETY: a slice describes exactly its own initialised, aligned elements,
// borrowed for as long as `self` is.
unsafe impl<T: Element> Buffer<T> for [T] {
    fn region(&self) -> Region {
        Region::host(crate::types::as_bytes(self))
    }
}

// SAFETY: as above, exclusively borrowed.
unsafe impl<T: Element> BufferMut<T> for [T] {
    fn region_mut(&mut self) -> Region {
        Region::host_mut(crate::types::as_bytes_mut(self))
    }
}

/// Containers that deref to a slice of their elements.
macro_rules! via_slice {
    ($($ty:ty => [$($gen:tt)*]),* $(,)?) => {$(
        // SAFETY: the container's slice, borrowed with the container.
        unsafe impl<$($gen)*> Buffer<T> for $ty {
            fn region(&self) -> Region {
                <[T] as Buffer<T>>::region(&self[..])
            }
        }
        // SAFETY: the container's slice, exclusively borrowed with it.
        unsafe impl<$($gen)*> BufferMut<T> for $ty {
            fn region_mut(&mut self) -> Region {
                <[T] as BufferMut<T>>::region_mut(&mut self[..])
            }
        }
    )*};
}

via_slice! {
    Vec<T> => [T: Element],
    Box<[T]> => [T: Element],
    [T; N] => [T: Element, const N: usize],
}

// SAFETY: the buffer's own mapping, `len` elements, page aligned; peers
// touch it only inside collectives this rank takes part in.
unsafe impl<T: Element> Buffer<T> for SharedBuffer<T> {
    fn region(&self) -> Region {
        self.region_of()
    }
}

// SAFETY: as above; `&mut self` excludes other local access.
unsafe impl<T: Element> BufferMut<T> for SharedBuffer<T> {
    fn region_mut(&mut self) -> Region {
        self.region_of()
    }
}
