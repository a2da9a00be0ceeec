//! `ncclUniqueId`: 128 opaque bytes every rank passes to
//! `ncclCommInitRank`. Ours hold oxccl's unique id in its text form
//! (`oxccl1:<secret>@<root address>`), NUL-terminated.
//!
//! `ncclGetUniqueId` starts the rendezvous root in the calling process, as
//! NCCL's does; the ids this process made are kept until a rank of this
//! process joins with one, so that rank joins with the root it hosts (its
//! failures are then relayed to the others rather than lost with it).

use crate::export;
use crate::result::{run, Failure};
use oxccl::UniqueId;
use std::sync::Mutex;

pub const NCCL_UNIQUE_ID_BYTES: usize = 128;

/// NCCL's `ncclUniqueId`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclUniqueId {
    pub internal: [u8; NCCL_UNIQUE_ID_BYTES],
}

/// The ids this process made (with the roots it hosts).
static MADE: Mutex<Vec<UniqueId>> = Mutex::new(Vec::new());

/// The bytes of `id`.
pub fn encode(id: &UniqueId) -> Result<ncclUniqueId, Failure> {
    let text = id.to_string();
    if text.len() >= NCCL_UNIQUE_ID_BYTES {
        return Err(Failure::new(
            crate::result::ncclInternalError,
            format!("unique id {text:?} does not fit in {NCCL_UNIQUE_ID_BYTES} bytes"),
        ));
    }
    let mut out = ncclUniqueId {
        internal: [0; NCCL_UNIQUE_ID_BYTES],
    };
    out.internal[..text.len()].copy_from_slice(text.as_bytes());
    Ok(out)
}

/// The oxccl id in `bytes`: the one this process made, when it made it.
pub fn decode(bytes: &ncclUniqueId) -> Result<UniqueId, Failure> {
    let end = bytes.internal.iter().position(|&b| b == 0).ok_or_else(|| {
        Failure::invalid("unique id: not NUL-terminated (not from ncclGetUniqueId)")
    })?;
    let text = std::str::from_utf8(&bytes.internal[..end])
        .map_err(|_| Failure::invalid("unique id: not from ncclGetUniqueId"))?;
    let id: UniqueId = text.parse()?;
    // The first rank of this process to join takes the hosted id (the
    // list does not grow with every id made).
    let mut made = MADE.lock().unwrap_or_else(|p| p.into_inner());
    Ok(match made.iter().position(|m| *m == id) {
        Some(i) => made.swap_remove(i),
        None => id,
    })
}

export! {
    /// `ncclGetUniqueId`: start a rendezvous root here (on the interface
    /// `NCCL_SOCKET_IFNAME` / `OXCCL_SOCKET_IFNAME` names, else the first
    /// usable one) and describe it in `uniqueId`.
    fn ncclGetUniqueId / pncclGetUniqueId(uniqueId: *mut ncclUniqueId) {
        run("ncclGetUniqueId", || {
            if uniqueId.is_null() {
                return Err(Failure::invalid("uniqueId is NULL"));
            }
            let config = crate::comm::config()?;
            let id = UniqueId::with_config(&config)?;
            let bytes = encode(&id)?;
            MADE.lock().unwrap_or_else(|p| p.into_inner()).push(id);
            // SAFETY: non-null, and the caller gives room for one id.
            unsafe { uniqueId.write(bytes) };
            Ok(())
        })
    }
}
