//! The handshake every connection starts with, bootstrap or transport.
//!
//! ```text
//! client -> server  Hello     64 B: magic, purpose, communicator id, from/to rank, nranks, stream, client nonce
//! server -> client  Challenge 48 B: magic, server nonce, MAC_s = SipHash128(secret, "srv" | hello | server nonce)
//! client -> server  Proof     16 B: MAC_c = SipHash128(secret, "cli" | hello | server nonce)
//! server -> client  Accept     8 B
//! ```
//!
//! Both sides prove they hold the job's 128-bit secret without sending it;
//! the nonces make every proof fresh, so a recorded handshake cannot be
//! replayed. Anything malformed, a wrong MAC, a wrong communicator or rank is
//! an `Error::Handshake` and the caller drops the connection. Callers set a
//! read timeout first so a silent client cannot hold a server thread forever.

use crate::error::{Error, Result};
use crate::wire::{Put, Reader};
use siphasher::sip128::{Hasher128, SipHasher24};
use std::fmt;
use std::hash::Hasher;
use std::io::{Read, Write};

const HELLO_MAGIC: &[u8; 8] = b"OXCCLHS1";
const CHALLENGE_MAGIC: &[u8; 8] = b"OXCCLHS2";
const ACCEPT: &[u8; 8] = b"OXCCLOK!";
/// Sent instead of a challenge when the server refuses the hello, so the
/// client fails saying why instead of "connection reset".
const REFUSE_MAGIC: &[u8; 8] = b"OXCCLNO!";
/// Refusal: the hello names another communicator (other secret or job).
const REFUSED_OTHER_JOB: u8 = 1;
/// Refusal: right communicator, but not a connection the server takes
/// (wrong purpose or rank, or its setup is over).
const REFUSED_UNEXPECTED: u8 = 2;
/// How every refusal's error text starts (see [`is_refusal`]).
const REFUSED: &str = "refused by the server";
/// Size of the hello message on the wire.
pub const HELLO_LEN: usize = 64;

/// The 128-bit job secret. `Debug` never prints it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Secret(pub [u8; 16]);

impl Secret {
    /// A fresh random secret from the OS.
    pub fn random() -> Result<Secret> {
        let mut b = [0u8; 16];
        getrandom::fill(&mut b)
            .map_err(|e| Error::Bootstrap(format!("no OS randomness for the job secret: {e}")))?;
        Ok(Secret(b))
    }

    /// A secret derived from text every rank knows (e.g. `OXCCL_SECRET`, or
    /// the job id when nothing better exists). Only as strong as the text.
    pub fn derive(text: &str) -> Secret {
        let mut h = SipHasher24::new_with_keys(0x6f78_6363_6c5f_6b31, 0x6465_7269_7665_6421);
        h.write(text.as_bytes());
        Secret(h.finish128().as_bytes())
    }

    /// Keyed 128-bit MAC of `parts` under this secret.
    pub fn mac(&self, parts: &[&[u8]]) -> [u8; 16] {
        let mut h = SipHasher24::new_with_key(&self.0);
        for p in parts {
            h.write(&(p.len() as u64).to_le_bytes());
            h.write(p);
        }
        h.finish128().as_bytes()
    }

    /// The communicator id implied by this secret (public; names the job).
    pub fn comm_id(&self) -> u64 {
        u64::from_le_bytes(self.mac(&[b"communicator-id"])[..8].try_into().unwrap())
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// What a connection is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Purpose {
    /// A rank's control connection to the rendezvous root.
    Bootstrap = 1,
    /// A TCP data stream between two ranks.
    Tcp = 2,
    /// Shared-memory setup between two ranks of one host.
    Shm = 3,
    /// RDMA endpoint exchange.
    Rdma = 4,
}

/// The `to` rank of a connection to the rendezvous root.
pub const ROOT: u32 = u32::MAX;

/// The client's opening message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    pub purpose: Purpose,
    pub comm_id: u64,
    pub from: u32,
    pub to: u32,
    pub nranks: u32,
    pub stream: u32,
    pub nonce: [u8; 16],
}

impl Hello {
    /// Check a data-link hello at the accepting rank of `ctx`: right
    /// purpose, this communicator, addressed to this rank, from a higher
    /// rank in range (the higher rank always connects).
    pub fn check_link(&self, purpose: Purpose, ctx: &crate::transport::SetupCtx) -> Result<()> {
        if self.purpose != purpose {
            return Err(Error::Handshake(format!(
                "{:?} connection sent to a {purpose:?} port",
                self.purpose
            )));
        }
        if self.comm_id != ctx.comm_id {
            return Err(Error::Handshake(format!(
                "communicator {:#x} is not this one ({:#x})",
                self.comm_id, ctx.comm_id
            )));
        }
        if self.to as usize != ctx.rank || self.nranks as usize != ctx.nranks {
            return Err(Error::Handshake(format!(
                "addressed to rank {} of {}, this is rank {} of {}",
                self.to, self.nranks, ctx.rank, ctx.nranks
            )));
        }
        if self.from as usize >= ctx.nranks || self.from as usize <= ctx.rank {
            return Err(Error::Handshake(format!(
                "rank {} may not connect to rank {}",
                self.from, ctx.rank
            )));
        }
        Ok(())
    }

    /// A hello with a fresh nonce.
    pub fn new(
        purpose: Purpose,
        comm_id: u64,
        from: usize,
        to: u32,
        nranks: usize,
        stream: usize,
    ) -> Result<Hello> {
        let mut nonce = [0u8; 16];
        getrandom::fill(&mut nonce)
            .map_err(|e| Error::Handshake(format!("no OS randomness: {e}")))?;
        Ok(Hello {
            purpose,
            comm_id,
            from: from as u32,
            to,
            nranks: nranks as u32,
            stream: stream as u32,
            nonce,
        })
    }

    /// Wire form, exactly [`HELLO_LEN`] bytes.
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut v = Vec::with_capacity(HELLO_LEN);
        v.extend_from_slice(HELLO_MAGIC);
        v.put_u8(self.purpose as u8);
        v.extend_from_slice(&[0; 3]);
        v.put_u64(self.comm_id);
        v.put_u32(self.from);
        v.put_u32(self.to);
        v.put_u32(self.nranks);
        v.put_u32(self.stream);
        v.extend_from_slice(&self.nonce);
        v.resize(HELLO_LEN, 0);
        v.try_into().unwrap()
    }

    /// Decode; any deviation is an error.
    pub fn decode(b: &[u8]) -> Result<Hello> {
        let bad = |m: &str| Error::Handshake(format!("malformed hello: {m}"));
        if b.len() != HELLO_LEN {
            return Err(bad("wrong length"));
        }
        let mut r = Reader::new(b, "hello");
        if r.bytes(8)? != HELLO_MAGIC {
            return Err(bad("bad magic (not an oxccl peer, or another version)"));
        }
        let purpose = match r.u8()? {
            1 => Purpose::Bootstrap,
            2 => Purpose::Tcp,
            3 => Purpose::Shm,
            4 => Purpose::Rdma,
            p => return Err(bad(&format!("unknown purpose {p}"))),
        };
        r.bytes(3)?;
        Ok(Hello {
            purpose,
            comm_id: r.u64()?,
            from: r.u32()?,
            to: r.u32()?,
            nranks: r.u32()?,
            stream: r.u32()?,
            nonce: r.array()?,
        })
    }
}

fn io_err(step: &str, e: std::io::Error) -> Error {
    Error::Handshake(format!("{step}: {e}"))
}

/// Whether a client-side error is the server's refusal (final: retrying
/// cannot help) rather than a connection that broke.
pub fn is_refusal(e: &Error) -> bool {
    matches!(e, Error::Handshake(m) if m.starts_with(REFUSED))
}

/// Run the client side; `Ok` means the server proved the secret and
/// accepted us.
pub fn client(s: &mut (impl Read + Write), secret: &Secret, hello: &Hello) -> Result<()> {
    let hb = hello.encode();
    s.write_all(&hb).map_err(|e| io_err("sending hello", e))?;
    let mut ch = [0u8; 48];
    s.read_exact(&mut ch)
        .map_err(|e| io_err("reading challenge (wrong secret or communicator?)", e))?;
    if &ch[..8] == REFUSE_MAGIC {
        let why = match ch[8] {
            REFUSED_OTHER_JOB => "it serves another communicator (a different OXCCL_SECRET or unique id, a different world size (OXCCL_WORLD_SIZE) under an address rendezvous, or another job at this address)",
            _ => "it does not expect this connection (wrong rank or purpose, or its setup is over)",
        };
        return Err(Error::Handshake(format!("{REFUSED}: {why}")));
    }
    if &ch[..8] != CHALLENGE_MAGIC {
        return Err(Error::Handshake("server sent a malformed challenge".into()));
    }
    let server_nonce = &ch[8..24];
    if secret.mac(&[b"srv", &hb, server_nonce]) != ch[24..40] {
        return Err(Error::Handshake(
            "server failed to prove the job secret".into(),
        ));
    }
    s.write_all(&secret.mac(&[b"cli", &hb, server_nonce]))
        .map_err(|e| io_err("sending proof", e))?;
    let mut ok = [0u8; 8];
    s.read_exact(&mut ok)
        .map_err(|e| io_err("awaiting accept (rejected by the server?)", e))?;
    if &ok != ACCEPT {
        return Err(Error::Handshake("server did not accept".into()));
    }
    Ok(())
}

/// Run the server side. `check` vets the hello (communicator id, ranks,
/// purpose) before any proof is exchanged.
pub fn server(
    s: &mut (impl Read + Write),
    secret: &Secret,
    comm_id: u64,
    check: impl FnOnce(&Hello) -> Result<()>,
) -> Result<Hello> {
    let mut hb = [0u8; HELLO_LEN];
    s.read_exact(&mut hb)
        .map_err(|e| io_err("reading hello", e))?;
    let hello = Hello::decode(&hb)?;
    // `check` sees every hello, even another communicator's (the root
    // uses that to name a rank started with a different secret).
    let vetted = check(&hello).and_then(|_| {
        if hello.comm_id != comm_id {
            Err(Error::Handshake(format!(
                "communicator {:#x} is not this one ({comm_id:#x})",
                hello.comm_id
            )))
        } else {
            Ok(())
        }
    });
    if let Err(e) = vetted {
        // Say why before hanging up (best effort: the client may be gone).
        let mut no = [0u8; 48];
        no[..8].copy_from_slice(REFUSE_MAGIC);
        no[8] = if hello.comm_id != comm_id {
            REFUSED_OTHER_JOB
        } else {
            REFUSED_UNEXPECTED
        };
        let _ = s.write_all(&no);
        return Err(e);
    }
    let mut server_nonce = [0u8; 16];
    getrandom::fill(&mut server_nonce)
        .map_err(|e| Error::Handshake(format!("no OS randomness: {e}")))?;
    let mut ch = Vec::with_capacity(48);
    ch.extend_from_slice(CHALLENGE_MAGIC);
    ch.extend_from_slice(&server_nonce);
    ch.extend_from_slice(&secret.mac(&[b"srv", &hb, &server_nonce]));
    ch.resize(48, 0);
    s.write_all(&ch)
        .map_err(|e| io_err("sending challenge", e))?;
    let mut proof = [0u8; 16];
    s.read_exact(&mut proof)
        .map_err(|e| io_err("reading proof", e))?;
    if secret.mac(&[b"cli", &hb, &server_nonce]) != proof {
        return Err(Error::Handshake(format!(
            "rank {} did not prove the job secret (a different job, or a stranger)",
            hello.from
        )));
    }
    s.write_all(ACCEPT)
        .map_err(|e| io_err("sending accept", e))?;
    Ok(hello)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (c, s)
    }

    /// The server side for communicator 7, admitting rank 1 only.
    fn rank_one_only(s: &mut TcpStream, secret: &Secret) -> Result<Hello> {
        server(s, secret, 7, |h| {
            if h.from == 1 {
                Ok(())
            } else {
                Err(Error::Handshake("rank".into()))
            }
        })
    }

    #[test]
    fn matching_secrets_shake_hands() {
        let secret = Secret::random().unwrap();
        let (mut c, mut s) = pair();
        let h = Hello::new(Purpose::Tcp, 7, 1, 0, 2, 0).unwrap();
        let t = std::thread::spawn(move || rank_one_only(&mut s, &secret));
        client(&mut c, &secret, &h).unwrap();
        assert_eq!(t.join().unwrap().unwrap(), h);
    }

    #[test]
    fn wrong_secret_is_rejected_on_both_sides() {
        let (mut c, mut s) = pair();
        let h = Hello::new(Purpose::Tcp, 7, 1, 0, 2, 0).unwrap();
        let t = std::thread::spawn(move || server(&mut s, &Secret([1; 16]), 7, |_| Ok(())));
        assert!(client(&mut c, &Secret([2; 16]), &h).is_err());
        drop(c);
        assert!(matches!(t.join().unwrap(), Err(Error::Handshake(_))));
    }

    #[test]
    fn a_refused_client_is_told_why() {
        for (comm_id, from, says) in [(8, 1, "another communicator"), (7, 5, "does not expect")] {
            let (mut c, mut s) = pair();
            let h = Hello::new(Purpose::Tcp, comm_id, from, 0, 2, 0).unwrap();
            let secret = Secret([1; 16]);
            let t = std::thread::spawn(move || rank_one_only(&mut s, &secret));
            let e = client(&mut c, &secret, &h).unwrap_err().to_string();
            assert!(e.contains(says), "{e}");
            assert!(t.join().unwrap().is_err());
        }
    }

    #[test]
    fn hello_decoder_rejects_garbage() {
        assert!(Hello::decode(&[0u8; 64]).is_err());
        assert!(Hello::decode(&[0u8; 3]).is_err());
        let h = Hello::new(Purpose::Bootstrap, 1, 2, ROOT, 3, 0).unwrap();
        assert_eq!(Hello::decode(&h.encode()).unwrap(), h);
        let mut b = h.encode();
        b[8] = 99;
        assert!(Hello::decode(&b).is_err());
    }
}
