//! `UniqueId`: how ranks find each other (like `ncclUniqueId`): the root's
//! address plus the job's 128-bit secret, printable as text to pass through
//! an environment variable, a file or a job scheduler.

use crate::bootstrap;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::handshake::Secret;
use crate::net;
use std::fmt;
use std::net::{SocketAddr, TcpListener};
use std::str::FromStr;
use std::time::Duration;

/// Root address + secret. `new()` also starts the root.
#[derive(Clone)]
pub struct UniqueId {
    root: SocketAddr,
    secret: Secret,
    /// The root, when this process hosts it (not part of the id's value).
    hosted: Option<std::sync::Arc<bootstrap::RootWatch>>,
}

impl PartialEq for UniqueId {
    fn eq(&self, other: &UniqueId) -> bool {
        self.root == other.root && self.secret == other.secret
    }
}

impl Eq for UniqueId {}

const PREFIX: &str = "oxccl1:";

impl UniqueId {
    /// Start a root on this host (address chosen like `OXCCL_SOCKET_IFNAME`
    /// says, port chosen by the OS) with a fresh random secret.
    pub fn new() -> Result<UniqueId> {
        UniqueId::with_config(&Config::from_env()?)
    }

    /// [`UniqueId::new`] with explicit configuration.
    pub fn with_config(cfg: &Config) -> Result<UniqueId> {
        let ip = net::pick_address(cfg.socket_ifname.as_deref())?;
        UniqueId::serve(SocketAddr::new(ip, 0), Secret::random()?, cfg.timeout)
    }

    /// Start a root listening on `addr` (port 0: any) with `secret`; ranks
    /// must register within `init_timeout`.
    pub fn serve(addr: SocketAddr, secret: Secret, init_timeout: Duration) -> Result<UniqueId> {
        let l = TcpListener::bind(addr).map_err(|e| {
            Error::Bootstrap(format!(
                "cannot listen on {addr} for the rendezvous root: {e}"
            ))
        })?;
        let root = l
            .local_addr()
            .map_err(|e| Error::Bootstrap(e.to_string()))?;
        let watch = std::sync::Arc::new(bootstrap::RootWatch::default());
        bootstrap::spawn_root(l, secret, init_timeout, watch.clone())?;
        Ok(UniqueId {
            root,
            secret,
            hosted: Some(watch),
        })
    }

    /// The root's watch, when this process hosts the root.
    pub fn hosted_root(&self) -> Option<&std::sync::Arc<bootstrap::RootWatch>> {
        self.hosted.as_ref()
    }

    /// An id for a root this process started itself (`shrink`'s leader).
    pub(crate) fn hosting(
        root: SocketAddr,
        secret: Secret,
        watch: std::sync::Arc<bootstrap::RootWatch>,
    ) -> UniqueId {
        UniqueId {
            root,
            secret,
            hosted: Some(watch),
        }
    }

    /// Like [`UniqueId::with_config`], also returning a watch on the root
    /// this process hosts: a launcher learns the job's first failure from
    /// it (see [`bootstrap::RootWatch`]).
    pub fn watched(cfg: &Config) -> Result<(UniqueId, std::sync::Arc<bootstrap::RootWatch>)> {
        let id = UniqueId::with_config(cfg)?;
        let watch = id.hosted.clone().expect("a served id hosts its root");
        Ok((id, watch))
    }

    /// The same id with the address ranks use to reach the root (when it
    /// listens on every interface and the ranks know it by another name).
    pub(crate) fn reached_at(mut self, root: SocketAddr) -> UniqueId {
        self.root = root;
        self
    }

    /// An id naming a root started elsewhere.
    pub fn from_parts(root: SocketAddr, secret: Secret) -> UniqueId {
        UniqueId {
            root,
            secret,
            hosted: None,
        }
    }

    /// The root's address.
    pub fn root(&self) -> SocketAddr {
        self.root
    }

    /// The job secret.
    pub fn secret(&self) -> &Secret {
        &self.secret
    }

    /// The communicator id every connection of this job names.
    pub fn comm_id(&self) -> u64 {
        self.secret.comm_id()
    }
}

impl fmt::Display for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(PREFIX)?;
        for b in self.secret.0 {
            write!(f, "{b:02x}")?;
        }
        write!(f, "@{}", self.root)
    }
}

impl fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UniqueId(root={}, secret=..)", self.root)
    }
}

impl FromStr for UniqueId {
    type Err = Error;

    /// Parse `oxccl1:<32 hex digits>@<ip>:<port>` (IPv6 as `[addr]:port`).
    fn from_str(s: &str) -> Result<UniqueId> {
        let bad = |m: &str| {
            Error::invalid(format!(
                "unique id {:?}: {m}",
                s.chars().take(80).collect::<String>()
            ))
        };
        let rest = s
            .trim()
            .strip_prefix(PREFIX)
            .ok_or_else(|| bad("does not start with oxccl1:"))?;
        let (hex, addr) = rest.split_once('@').ok_or_else(|| bad("missing '@'"))?;
        if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad("secret must be 32 hex digits"));
        }
        let mut secret = [0u8; 16];
        for (i, b) in secret.iter_mut().enumerate() {
            *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad("bad hex"))?;
        }
        let root: SocketAddr = addr
            .parse()
            .map_err(|_| bad("root address must be ip:port"))?;
        if root.port() == 0 {
            return Err(bad("root port 0"));
        }
        Ok(UniqueId {
            root,
            secret: Secret(secret),
            hosted: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_round_trip() {
        let id = UniqueId::from_parts("127.0.0.1:4242".parse().unwrap(), Secret([0xab; 16]));
        let s = id.to_string();
        assert_eq!(s, format!("oxccl1:{}@127.0.0.1:4242", "ab".repeat(16)));
        assert_eq!(s.parse::<UniqueId>().unwrap(), id);
        let v6 = UniqueId::from_parts("[::1]:9".parse().unwrap(), Secret([1; 16]));
        assert_eq!(v6.to_string().parse::<UniqueId>().unwrap(), v6);
    }

    #[test]
    fn bad_text_is_an_error() {
        for s in [
            "",
            "oxccl1:",
            "oxccl1:zz@1.2.3.4:5",
            "nccl:00@1.2.3.4:5",
            &format!("oxccl1:{}@nowhere", "0".repeat(32)),
            &format!("oxccl1:{}@1.2.3.4:0", "0".repeat(32)),
            "oxccl1:é@",
        ] {
            assert!(
                matches!(s.parse::<UniqueId>(), Err(Error::InvalidArgument(_))),
                "{s}"
            );
        }
    }
}
