//! The control connection's messages: what a rank sends the root (its
//! registration, then aborts, monitored-barrier arrivals, goodbye) and what
//! the root answers (the peer table or a rejection, then notices and
//! barrier releases). Encoders and total decoders only; who sends what and
//! when is [`super::root`] (the root) and [`super::bootstrap`] (a rank).

use super::notice::{Notice, MSG_NOTICE};
use super::root::Reply;
use crate::config::vars::MAX_RANKS;
use crate::error::{Error, Result};
use crate::transport::PeerInfo;
use crate::wire::{self, Put, Reader};
use std::time::Duration;

pub(crate) const MSG_REGISTER: u8 = 1;
pub(crate) const MSG_ABORT: u8 = 2;
pub(crate) const MSG_GOODBYE: u8 = 3;
/// A rank arrived at monitored barrier `n` (u64) and waits `ms` (u64).
pub(crate) const MSG_ARRIVE: u8 = 4;
pub(crate) const MSG_TABLE: u8 = 10;
pub(crate) const MSG_REJECT: u8 = 11;
/// Every rank arrived at monitored barrier `n` (u64).
pub(crate) const MSG_RELEASE: u8 = 13;

/// Longest rejection text (bounds the decoder).
pub(crate) const REJECT_TEXT: usize = 4096;

/// What a registered rank tells the root.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum FromRank {
    /// It leaves normally.
    Goodbye,
    /// It arrived at monitored barrier `barrier` and waits `wait`.
    Arrive { barrier: u64, wait: Duration },
    /// It failed; `None` when the cause was unreadable.
    Abort(Option<Notice>),
}

/// Decode one frame a registered rank sent.
pub(crate) fn decode_from_rank(frame: &[u8]) -> Result<FromRank> {
    let mut r = Reader::new(frame, "control message");
    match r.u8()? {
        MSG_GOODBYE => Ok(FromRank::Goodbye),
        MSG_ARRIVE => Ok(FromRank::Arrive {
            barrier: r.u64()?,
            wait: Duration::from_millis(r.u64()?),
        }),
        MSG_ABORT => Ok(FromRank::Abort(
            r.u8()
                .ok()
                .filter(|t| *t == MSG_NOTICE)
                .and_then(|_| Notice::decode(&mut r).ok()),
        )),
        t => Err(Error::Protocol(format!("unknown control message {t}"))),
    }
}

/// Encode what a rank tells the root (a registration is [`encode_registration`]).
pub(crate) fn encode_from_rank(m: &FromRank) -> Vec<u8> {
    match m {
        FromRank::Goodbye => vec![MSG_GOODBYE],
        FromRank::Arrive { barrier, wait } => {
            let mut v = vec![MSG_ARRIVE];
            v.put_u64(*barrier);
            v.put_u64(wait.as_millis().min(u64::MAX as u128) as u64);
            v
        }
        FromRank::Abort(notice) => {
            let mut v = vec![MSG_ABORT];
            if let Some(n) = notice {
                v.extend_from_slice(&n.encode_frame());
            }
            v
        }
    }
}

/// Encode the root's answer to one or more ranks.
pub(crate) fn encode_reply(reply: &Reply) -> Vec<u8> {
    match reply {
        Reply::Table(infos) => {
            let mut v = vec![MSG_TABLE];
            v.put_u32(infos.len() as u32);
            for i in infos {
                encode_info(&mut v, i);
            }
            v
        }
        Reply::Reject(why) => {
            let mut v = vec![MSG_REJECT];
            v.put_str(why);
            v
        }
        Reply::Release(number) => {
            let mut v = vec![MSG_RELEASE];
            v.put_u64(*number);
            v
        }
    }
}

/// A rank's registration: its claimed world size, its [`PeerInfo`] and the
/// settings that must agree.
pub(crate) fn encode_registration(
    nranks: usize,
    me: &PeerInfo,
    settings: &[(&str, String)],
) -> Vec<u8> {
    let mut reg = vec![MSG_REGISTER];
    reg.put_u32(nranks as u32);
    encode_info(&mut reg, me);
    encode_settings(&mut reg, settings);
    reg
}

/// Encode one [`PeerInfo`] (registration and table entries).
pub fn encode_info(v: &mut Vec<u8>, p: &PeerInfo) {
    v.put_u32(p.rank as u32);
    v.put_str(&p.hostname);
    v.put_u64(p.host_id);
    v.put_u32(p.pid);
    v.put_u8(p.addrs.len() as u8);
    for a in &p.addrs {
        v.put_blob(a);
    }
    v.put_str(&p.rescue.map(|a| a.to_string()).unwrap_or_default());
    v.put_u8(p.hosts_root as u8);
    v.put_blob(&p.cpus);
    v.put_u64(p.llc.map_or(0, |b| b as u64));
}

/// Decode one [`PeerInfo`] (bounded: 255 addresses of at most 4 KiB, a
/// mask of at most [`MAX_CPU_MASK`] bytes).
pub fn decode_info(r: &mut Reader<'_>) -> Result<PeerInfo> {
    let rank = r.u32()? as usize;
    let hostname = r.string(255)?;
    let host_id = r.u64()?;
    let pid = r.u32()?;
    let n = r.u8()? as usize;
    let mut addrs = Vec::with_capacity(n);
    for _ in 0..n {
        addrs.push(r.blob(4096)?.to_vec());
    }
    let rescue = match r.string(64)? {
        t if t.is_empty() => None,
        t => Some(
            t.parse()
                .map_err(|_| Error::Protocol(format!("rank {rank}: bad rescue address {t:?}")))?,
        ),
    };
    let hosts_root = match r.u8()? {
        0 => false,
        1 => true,
        b => return Err(Error::Protocol(format!("rank {rank}: bad root flag {b}"))),
    };
    let cpus = r.blob(MAX_CPU_MASK)?.to_vec();
    // 0: unknown (a cache too large for this machine's usize is as good).
    let llc = match r.u64()? {
        0 => None,
        b => Some(usize::try_from(b).unwrap_or(usize::MAX)),
    };
    Ok(PeerInfo {
        rank,
        hostname,
        host_id,
        pid,
        addrs,
        rescue,
        hosts_root,
        cpus,
        llc,
    })
}

/// Longest CPU mask a [`PeerInfo`] carries: 8192 CPUs
/// ([`crate::sys::affinity`]).
pub const MAX_CPU_MASK: usize = 1024;

/// Decode a table message body (after the type byte).
pub fn decode_table(r: &mut Reader<'_>) -> Result<Vec<PeerInfo>> {
    let n = r.u32()? as usize;
    if n == 0 || n > MAX_RANKS {
        return Err(Error::Protocol(format!("peer table with {n} ranks")));
    }
    // Grow as entries actually decode: `n` is only a claim.
    let mut v = Vec::with_capacity(n.min(64));
    for i in 0..n {
        let p = decode_info(r)?;
        if p.rank != i {
            return Err(Error::Protocol(format!(
                "peer table entry {i} claims rank {}",
                p.rank
            )));
        }
        v.push(p);
    }
    r.finish()?;
    Ok(v)
}

/// Settings a rank registers with: (variable, value) pairs that must be
/// the same on every rank (see `Config::agreement`).
pub type Settings = Vec<(String, String)>;

/// Most settings one registration carries (bounds the decoder).
const MAX_SETTINGS: usize = 32;

/// Encode the settings of a registration (after its `PeerInfo`).
pub fn encode_settings(v: &mut Vec<u8>, settings: &[(&str, String)]) {
    v.put_u8(settings.len() as u8);
    for (name, value) in settings {
        v.put_str(name);
        v.put_str(value);
    }
}

fn decode_settings(r: &mut Reader<'_>) -> Result<Settings> {
    let n = r.u8()? as usize;
    if n > MAX_SETTINGS {
        return Err(Error::Protocol(format!("a registration with {n} settings")));
    }
    (0..n)
        .map(|_| Ok((r.string(64)?, r.string(256)?)))
        .collect()
}

/// The first setting in which `b` differs from `a`, as text naming both
/// ranks and both values; `None` when they agree.
pub fn settings_differ(a: (usize, &Settings), b: (usize, &Settings)) -> Option<String> {
    let value = |s: &Settings, name: &str| {
        s.iter().find(|(n, _)| n == name).map_or_else(
            || "(not sent: an older oxccl)".to_string(),
            |(_, v)| v.clone(),
        )
    };
    // Every name either side sent (a name both sent is compared twice,
    // harmlessly: the first difference is what is reported).
    a.1.iter().chain(b.1.iter()).map(|(n, _)| n.as_str()).find_map(|name| {
        let (va, vb) = (value(a.1, name), value(b.1, name));
        (va != vb).then(|| {
            format!(
                "ranks disagree on {name}: rank {} has {vb}, rank {} has {va} (it must be the same on every rank)",
                b.0, a.0
            )
        })
    })
}

/// Decode a rank's registration (it must name the rank its handshake did).
pub fn parse_registration(reg: &[u8], from: usize) -> Result<(usize, PeerInfo, Settings)> {
    let mut r = Reader::new(reg, "registration");
    if r.u8()? != MSG_REGISTER {
        return Err(Error::Protocol("expected a registration".into()));
    }
    let nranks = r.u32()? as usize;
    let info = decode_info(&mut r)?;
    let settings = decode_settings(&mut r)?;
    r.finish()?;
    if nranks == 0 || nranks > MAX_RANKS || info.rank >= nranks || info.rank != from {
        return Err(Error::Protocol(format!(
            "rank {} of {nranks} is out of range",
            info.rank
        )));
    }
    Ok((nranks, info, settings))
}

/// Decode everything a rank can receive on its control connection: a
/// stream of length-prefixed frames, each a table, a rejection or a notice.
pub fn parse_control_stream(mut bytes: &[u8]) -> Vec<Result<Notice>> {
    let mut out = Vec::new();
    while let Ok(Some(frame)) = wire::read_frame(&mut bytes, wire::MAX_FRAME) {
        let mut r = Reader::new(&frame, "control message");
        out.push(match r.u8() {
            Ok(MSG_NOTICE) => Notice::decode(&mut r),
            Ok(MSG_TABLE) => decode_table(&mut r).map(|_| Notice::Lost {
                rank: 0,
                detail: String::new(),
            }),
            Ok(MSG_RELEASE) => r.u64().map(|_| Notice::Lost {
                rank: 0,
                detail: String::new(),
            }),
            Ok(MSG_REJECT) => r.string(4096).map(|m| Notice::Failed {
                origin: 0,
                aborted: false,
                message: m,
            }),
            Ok(t) => Err(Error::Protocol(format!("unknown control message {t}"))),
            Err(e) => Err(e),
        });
    }
    out
}
