//! Entry points for fuzzing every decoder of bytes that come from outside
//! the process. Each takes arbitrary bytes and must return without
//! panicking and without allocating more than a fixed bound (length fields
//! are capped before anything is allocated). Used by the `cargo fuzz`
//! targets in `fuzz/` and by the corpus-replay test that CI runs on stable.

use crate::control::message;
use crate::executor::{WireHeader, HEADER_LEN};
use crate::handshake::Hello;
use crate::id::UniqueId;
use crate::wire::{self, Reader};

/// A small deterministic random source (xorshift64) for fuzz mutations and
/// random-interaction tests: the same seed replays the same run.
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform-ish in `0..n` (`0` when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    /// True with probability `percent` / 100.
    pub fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
}

/// The decoders, by name (also the fuzz target and corpus folder names).
pub const TARGETS: [&str; 7] = [
    "unique_id",
    "hello",
    "registration",
    "peer_table",
    "control_stream",
    "message_header",
    "frame",
];

/// Run the decoder `target` on `data`.
pub fn run(target: &str, data: &[u8]) {
    match target {
        "unique_id" => unique_id(data),
        "hello" => hello(data),
        "registration" => registration(data),
        "peer_table" => peer_table(data),
        "control_stream" => control_stream(data),
        "message_header" => message_header(data),
        "frame" => frame(data),
        other => panic!("no fuzz target {other}"),
    }
}

/// `UniqueId` text (environment variables, files).
pub fn unique_id(data: &[u8]) {
    if let Ok(s) = std::str::from_utf8(data) {
        if let Ok(id) = s.parse::<UniqueId>() {
            // What parses must print back to something that parses the same.
            assert_eq!(id.to_string().parse::<UniqueId>().unwrap(), id);
        }
    }
}

/// The handshake's opening message.
pub fn hello(data: &[u8]) {
    if let Ok(h) = Hello::decode(data) {
        assert_eq!(Hello::decode(&h.encode()).unwrap(), h);
    }
}

/// A rank's registration at the root.
pub fn registration(data: &[u8]) {
    let from = data.first().copied().unwrap_or(0) as usize;
    let _ = message::parse_registration(data, from);
}

/// The peer table the root sends (after its type byte).
pub fn peer_table(data: &[u8]) {
    let _ = message::decode_table(&mut Reader::new(data, "fuzz table"));
}

/// Everything a rank reads on its control connection.
pub fn control_stream(data: &[u8]) {
    let _ = message::parse_control_stream(data);
}

/// A data message header.
pub fn message_header(data: &[u8]) {
    if data.len() >= HEADER_LEN {
        let _ = WireHeader::parse(data[..HEADER_LEN].try_into().unwrap());
    }
}

/// A length-prefixed frame (bootstrap and control).
pub fn frame(mut data: &[u8]) {
    let _ = wire::read_frame(&mut data, wire::MAX_FRAME);
}

/// Valid (and a few famous-bad) inputs per target: the seed corpus.
pub fn seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    use crate::call::{Fingerprint, Kind};
    use crate::control::message::encode_info;
    use crate::control::notice::Notice;
    use crate::handshake::{Purpose, Secret, ROOT};
    use crate::transport::PeerInfo;
    use crate::types::{DataType, ReduceOp};
    use crate::wire::Put;
    let mut out = Vec::new();
    let id = UniqueId::from_parts("127.0.0.1:29500".parse().unwrap(), Secret([0x5a; 16]));
    out.push(("unique_id", "v4".into(), id.to_string().into_bytes()));
    let id6 = UniqueId::from_parts("[::1]:7".parse().unwrap(), Secret([1; 16]));
    out.push(("unique_id", "v6".into(), id6.to_string().into_bytes()));
    out.push(("unique_id", "bad".into(), b"oxccl1:zz@nowhere".to_vec()));
    let h = Hello {
        purpose: Purpose::Tcp,
        comm_id: 7,
        from: 1,
        to: 0,
        nranks: 4,
        stream: 1,
        nonce: [3; 16],
    };
    out.push(("hello", "tcp".into(), h.encode().to_vec()));
    let h = Hello {
        purpose: Purpose::Bootstrap,
        to: ROOT,
        ..h
    };
    out.push(("hello", "root".into(), h.encode().to_vec()));
    let info = PeerInfo {
        rank: 2,
        hostname: "node-7".into(),
        host_id: 99,
        pid: 4242,
        addrs: vec![
            b"10.0.0.7:4000".to_vec(),
            b"oxccl-0123456789abcdef".to_vec(),
        ],
        rescue: Some("10.0.0.7:4001".parse().unwrap()),
        hosts_root: false,
        cpus: vec![0b11],
        llc: Some(8 << 20),
    };
    let mut reg = vec![1u8];
    reg.put_u32(4);
    encode_info(&mut reg, &info);
    message::encode_settings(&mut reg, &crate::Config::default().agreement());
    out.push(("registration", "rank2".into(), reg));
    let mut table = Vec::new();
    table.put_u32(2);
    for r in 0..2 {
        encode_info(
            &mut table,
            &PeerInfo {
                rank: r,
                ..info.clone()
            },
        );
    }
    out.push(("peer_table", "two".into(), table.clone()));
    let mut stream = Vec::new();
    let mut tframe = vec![10u8];
    tframe.extend_from_slice(&table);
    wire::write_frame(&mut stream, &tframe).unwrap();
    for n in [
        Notice::Lost {
            rank: 3,
            detail: "gone".into(),
        },
        Notice::Failed {
            origin: 1,
            aborted: true,
            message: "abort()".into(),
        },
        Notice::Mismatch {
            a: 0,
            a_call: "all_reduce(count=4, f32, sum) as collective #0".into(),
            b: 1,
            b_call: "all_gather(count=1, f32) as collective #0".into(),
        },
        Notice::Timeout {
            origin: 2,
            waiting_for: "data from rank 3".into(),
            after_ms: 1000,
            waits_on: 3,
        },
        Notice::Stalled {
            rank: 3,
            detail: "stopped".into(),
            after_ms: 1000,
        },
        Notice::Cycle {
            ranks: vec![1, 2],
            detail: "ranks [1, 2] wait for each other".into(),
            after_ms: 1000,
        },
    ] {
        wire::write_frame(&mut stream, &n.encode_frame()).unwrap();
    }
    out.push(("control_stream", "all".into(), stream));
    let fp = Fingerprint::new(Kind::AllReduce, DataType::F32, 1024).with_op(ReduceOp::Sum);
    let mut hdr = vec![0u8; HEADER_LEN];
    hdr[..4].copy_from_slice(b"OXM1");
    hdr[8..16].copy_from_slice(&5u64.to_le_bytes());
    hdr[24..32].copy_from_slice(&4096u64.to_le_bytes());
    hdr[32..48].copy_from_slice(&fp.encode());
    out.push(("message_header", "allreduce".into(), hdr));
    let mut f = Vec::new();
    wire::write_frame(&mut f, b"hello frame").unwrap();
    out.push(("frame", "small".into(), f));
    out.push(("frame", "huge_len".into(), u32::MAX.to_le_bytes().to_vec()));
    out
}
