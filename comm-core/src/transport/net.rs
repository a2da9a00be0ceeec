//! Choosing the local address that sockets bind to, NCCL style:
//! `OXCCL_SOCKET_IFNAME` selects interfaces by name prefix (`eth`), excludes
//! them (`^docker`) or names one exactly (`=eth1`); without it the first
//! non-loopback interface that is up wins, and loopback when there is none.

use crate::error::{Error, Result};
use std::ffi::CStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// One address of one local interface.
#[derive(Clone, Debug, PartialEq)]
pub struct Interface {
    pub name: String,
    pub addr: IpAddr,
}

/// Every IPv4/IPv6 address of every interface that is up.
pub fn interfaces() -> Vec<Interface> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return out;
    }
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned and not yet freed.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_flags & libc::IFF_UP as u32 == 0 {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: ifa_addr is non-null and its family says which sockaddr it is.
        let addr = unsafe {
            match (*ifa.ifa_addr).sa_family as i32 {
                libc::AF_INET => {
                    let sa = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                    IpAddr::V4(Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr)))
                }
                libc::AF_INET6 => {
                    let sa = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                    IpAddr::V6(Ipv6Addr::from(sa.sin6_addr.s6_addr))
                }
                _ => continue,
            }
        };
        // Link-local IPv6 needs a scope id to be usable; skip it.
        if let IpAddr::V6(v6) = addr {
            if v6.segments()[0] & 0xffc0 == 0xfe80 {
                continue;
            }
        }
        out.push(Interface { name, addr });
    }
    // SAFETY: `head` came from getifaddrs and is freed exactly once.
    unsafe { libc::freeifaddrs(head) };
    out
}

/// Whether `name` matches a comma-separated list of name prefixes or
/// `=exact` names (the NCCL interface/device list syntax, without `^`).
pub fn matches(spec: &str, name: &str) -> bool {
    spec.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .any(|s| match s.strip_prefix('=') {
            Some(exact) => name == exact,
            None => name.starts_with(s),
        })
}

/// Pick the address to bind, given `OXCCL_SOCKET_IFNAME`'s value.
pub fn pick_address(ifname: Option<&str>) -> Result<IpAddr> {
    pick_from(&interfaces(), ifname)
}

/// [`pick_address`] over an explicit interface list (testable).
pub fn pick_from(all: &[Interface], ifname: Option<&str>) -> Result<IpAddr> {
    // IPv4 first, like NCCL: it is what most clusters route.
    let mut sorted: Vec<&Interface> = all.iter().collect();
    sorted.sort_by_key(|i| i.addr.is_ipv6());
    let chosen = match ifname {
        Some(spec) => {
            let (exclude, spec) = match spec.strip_prefix('^') {
                Some(rest) => (true, rest),
                None => (false, spec),
            };
            sorted
                .into_iter()
                .find(|i| matches(spec, &i.name) != exclude)
        }
        None => sorted
            .iter()
            .find(|i| !i.addr.is_loopback())
            .or_else(|| sorted.iter().find(|i| i.addr.is_loopback()))
            .copied(),
    };
    chosen.map(|i| i.addr).ok_or_else(|| {
        let names: Vec<&str> = all.iter().map(|i| i.name.as_str()).collect();
        Error::Config(format!(
            "no network interface matches OXCCL_SOCKET_IFNAME={:?}; interfaces that are up: {names:?}",
            ifname.unwrap_or("")
        ))
    })
}

/// A listener on an ephemeral port (`bind` asks the kernel for port 0)
/// that is not `reserved`. A rank can start before the rank that hosts the
/// rendezvous root has bound the root's port, and the kernel may hand
/// that very port out as an ephemeral one (a root port picked from the
/// ephemeral range, as a free-port helper does, is often free again
/// right away): the root then cannot listen and the whole job fails to
/// start. Should it happen, bind again while holding the first socket
/// (so the kernel gives another port), then let the first go.
pub fn bind_clear_of<L>(
    reserved: Option<u16>,
    mut bind: impl FnMut() -> Result<L>,
    port: impl Fn(&L) -> Option<u16>,
) -> Result<L> {
    let first = bind()?;
    if reserved.is_none() || port(&first) != reserved {
        return Ok(first);
    }
    let second = bind()?;
    drop(first);
    Ok(second)
}

/// An epoll fd watching `fds` for input and hang-up: one fd a link hands
/// the executor's `poll(2)` for several wake-up sources.
pub fn epoll_of(fds: &[std::os::fd::RawFd]) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    // SAFETY: plain syscall; the fd is owned below.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if ep < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fresh fd.
    let ep = unsafe { OwnedFd::from_raw_fd(ep) };
    for &fd in fds {
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLRDHUP) as u32,
            u64: fd as u64,
        };
        // SAFETY: registering a valid fd with a valid event struct.
        if unsafe { libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(ep)
}

/// Whether the peer end of the stream socket `fd` has hung up
/// (non-blocking check).
pub fn hung_up(fd: std::os::fd::RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN | libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    let r = unsafe { libc::poll(&mut p, 1, 0) };
    r > 0 && p.revents & (libc::POLLHUP | libc::POLLRDHUP | libc::POLLERR) != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listener_never_keeps_the_reserved_port() {
        // The kernel's picks, in order: the root's port first.
        let picks = |v: Vec<u16>| {
            let mut it = v.into_iter();
            move || Ok(it.next().expect("bound at most twice"))
        };
        let port = |p: &u16| Some(*p);
        assert_eq!(bind_clear_of(Some(7), picks(vec![7, 9]), port).unwrap(), 9);
        assert_eq!(bind_clear_of(Some(7), picks(vec![8]), port).unwrap(), 8);
        assert_eq!(bind_clear_of(None, picks(vec![7]), port).unwrap(), 7);
    }

    fn list() -> Vec<Interface> {
        vec![
            Interface {
                name: "lo".into(),
                addr: "127.0.0.1".parse().unwrap(),
            },
            Interface {
                name: "docker0".into(),
                addr: "172.17.0.1".parse().unwrap(),
            },
            Interface {
                name: "eth0".into(),
                addr: "10.0.0.5".parse().unwrap(),
            },
        ]
    }

    #[test]
    fn default_prefers_non_loopback() {
        assert_eq!(pick_from(&list(), None).unwrap().to_string(), "172.17.0.1");
        assert_eq!(
            pick_from(&list()[..1], None).unwrap().to_string(),
            "127.0.0.1"
        );
    }

    #[test]
    fn prefix_exclude_and_exact() {
        assert_eq!(
            pick_from(&list(), Some("eth")).unwrap().to_string(),
            "10.0.0.5"
        );
        assert_eq!(
            pick_from(&list(), Some("^docker,lo")).unwrap().to_string(),
            "10.0.0.5"
        );
        assert_eq!(
            pick_from(&list(), Some("=lo")).unwrap().to_string(),
            "127.0.0.1"
        );
        assert!(matches!(
            pick_from(&list(), Some("ib")),
            Err(Error::Config(_))
        ));
    }

    #[test]
    fn this_machine_has_loopback() {
        assert!(interfaces().iter().any(|i| i.addr.is_loopback()));
    }
}
