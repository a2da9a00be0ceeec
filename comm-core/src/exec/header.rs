//! The 48-byte header in front of every message: magic, the ids of the
//! call's registered buffers (0 for plain memory), sequence number,
//! message index, payload length and the call's fingerprint.

use crate::call::Fingerprint;

/// Bytes of the per-message header.
pub const HEADER_LEN: usize = 48;
pub(crate) const MAGIC: &[u8; 4] = b"OXM1";

/// A message header as read from the wire (see [`HEADER_LEN`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WireHeader {
    pub seq: u64,
    /// Ids of the registered buffers behind INPUT (high half) and OUTPUT.
    pub bufs: u64,
    pub msg: u32,
    pub len: u64,
    /// `None` when the fingerprint bytes name no known call.
    pub fp: Option<Fingerprint>,
}

impl WireHeader {
    /// Decode; `None` unless the magic is right. Total: any 48 bytes.
    pub fn parse(h: &[u8; HEADER_LEN]) -> Option<WireHeader> {
        if &h[..4] != MAGIC {
            return None;
        }
        Some(WireHeader {
            seq: u64::from_le_bytes(h[8..16].try_into().unwrap()),
            bufs: (u32::from_le_bytes(h[4..8].try_into().unwrap()) as u64) << 32
                | u32::from_le_bytes(h[20..24].try_into().unwrap()) as u64,
            msg: u32::from_le_bytes(h[16..20].try_into().unwrap()),
            len: u64::from_le_bytes(h[24..32].try_into().unwrap()),
            fp: Fingerprint::decode(h[32..48].try_into().unwrap()),
        })
    }
}
