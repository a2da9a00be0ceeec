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

/// Encode a header (the inverse of [`WireHeader::parse`]).
pub(crate) fn encode(
    seq: u64,
    bufs: u64,
    msg: u32,
    len: u64,
    fp: &Fingerprint,
) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..4].copy_from_slice(MAGIC);
    h[4..8].copy_from_slice(&((bufs >> 32) as u32).to_le_bytes());
    h[20..24].copy_from_slice(&(bufs as u32).to_le_bytes());
    h[8..16].copy_from_slice(&seq.to_le_bytes());
    h[16..20].copy_from_slice(&msg.to_le_bytes());
    h[24..32].copy_from_slice(&len.to_le_bytes());
    h[32..48].copy_from_slice(&fp.encode());
    h
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
