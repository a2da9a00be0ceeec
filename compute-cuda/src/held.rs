//! Whether some caller's stream waits on this process's queued calls.
//!
//! A queued call (NCCL's semantics) holds its caller's stream at a gate
//! until the call is over. While such a stream waits, nothing that runs the
//! call may make a CUDA call that waits for the whole device: `cuMemAlloc`,
//! `cuMemFree`, `cuMemHostAlloc`, `cuMemFreeHost`, module loading and
//! context synchronisation may each wait for every stream of the device
//! to drain — the held stream included, which waits for the call, which
//! waits for the allocation. On the H200 every queued call hung while
//! non-queued calls on the same memory passed; the first queued call of a
//! communicator is the one that allocates the engine's memory.
//!
//! So the gate counts the streams it holds here, process-wide (any
//! communicator's gate holds a stream of the device any engine may wait
//! for), and the engine, while the count is above zero, takes what never
//! waits: stream-ordered device memory, plain host memory for staging that
//! outgrows its pinned block, modules loaded before the hold.

use std::sync::atomic::{AtomicUsize, Ordering};

static HELD: AtomicUsize = AtomicUsize::new(0);

/// One stream held at a gate: counted from creation until dropped (after
/// the gate was opened for it).
#[derive(Debug)]
pub struct HeldStream(());

impl HeldStream {
    /// Count one more held stream.
    #[allow(clippy::new_without_default)]
    pub fn new() -> HeldStream {
        HELD.fetch_add(1, Ordering::SeqCst);
        HeldStream(())
    }
}

impl Drop for HeldStream {
    fn drop(&mut self) {
        HELD.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Whether any stream is held at a gate in this process now.
pub fn any_stream_held() -> bool {
    HELD.load(Ordering::SeqCst) > 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_while_held() {
        // Other tests of this crate hold none.
        assert!(!any_stream_held());
        let a = HeldStream::new();
        let b = HeldStream::new();
        assert!(any_stream_held());
        drop(a);
        assert!(any_stream_held());
        drop(b);
        assert!(!any_stream_held());
    }
}
