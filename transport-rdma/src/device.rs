//! Choosing the device, port and GID, and the verbs knobs, from the
//! environment (NCCL's `NCCL_IB_*` variables, spelled `OXCCL_IB_*`):
//!
//! - `OXCCL_IB_HCA`: devices to use, `mlx5_0:1,mlx5_1` (name prefixes,
//!   `=exact`, optional `:port`), or `^mlx5_2` to exclude. Default: the
//!   first device with an active port.
//! - `OXCCL_IB_GID_INDEX`: GID index. Default on Ethernet (RoCE): a RoCE v2
//!   GID holding an IPv4 address, else any RoCE v2 GID, else RoCE v1;
//!   on InfiniBand: none (LID routing).
//! - `OXCCL_IB_TIMEOUT` (ACK timeout exponent, 4.096 µs × 2^t, default 18 ≈
//!   1 s), `OXCCL_IB_RETRY_CNT` (default 7), `OXCCL_IB_TC` (traffic class).

#[cfg(feature = "verbs")]
pub use with_verbs::{choose, Choice};

/// `OXCCL_IB_HCA` parsed: (exclude?, [(name spec, port)]).
pub fn parse_hca(spec: &str) -> (bool, Vec<(String, Option<u8>)>) {
    let (exclude, list) = match spec.trim().strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, spec.trim()),
    };
    let items = list
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| match s.rsplit_once(':') {
            Some((n, p)) => (n.to_string(), p.parse().ok()),
            None => (s.to_string(), None),
        })
        .collect();
    (exclude, items)
}

/// Whether device `name`, port `port` passes the `OXCCL_IB_HCA` filter.
pub fn allowed(filter: &(bool, Vec<(String, Option<u8>)>), name: &str, port: u8) -> bool {
    let (exclude, items) = filter;
    if items.is_empty() {
        return true;
    }
    let hit = items.iter().any(|(spec, p)| {
        comm_core::net::matches(spec, name) && !matches!(p, Some(q) if *q != port)
    });
    hit != *exclude
}

/// Rank of a GID for automatic selection (higher is better; None = unusable).
pub fn gid_rank(gid: &[u8; 16], kind: &str) -> Option<u8> {
    if gid.iter().all(|b| *b == 0) {
        return None;
    }
    let v4_mapped = gid[..10].iter().all(|b| *b == 0) && gid[10] == 0xff && gid[11] == 0xff;
    match (kind.trim(), v4_mapped) {
        ("RoCE v2", true) => Some(3),
        ("RoCE v2", false) => Some(2),
        (_, _) => Some(1),
    }
}

#[cfg(feature = "verbs")]
mod with_verbs {
    use super::{allowed, gid_rank, parse_hca};
    use crate::verbs::{self, Context, QpSettings};
    use comm_core::{Error, Result};
    use ibverbs_sys as ffi;

    /// A usable port of an opened device.
    pub struct Choice {
        pub ctx: Context,
        pub settings: QpSettings,
        pub lid: u16,
        pub gid: [u8; 16],
    }

    /// An `OXCCL_IB_*` variable (or its NCCL alias, under libnccl).
    fn env(name: &str) -> Option<String> {
        comm_core::config::vars::raw(name)
    }

    /// A numeric `OXCCL_IB_*` variable, range-checked by the variable table.
    fn env_num(name: &str, default: u32) -> Result<u32> {
        Ok(comm_core::config::vars::count(name)?.map_or(default, |n| n as u32))
    }

    fn gid_kind(dev: &str, port: u8, index: u32) -> String {
        std::fs::read_to_string(format!(
            "/sys/class/infiniband/{dev}/ports/{port}/gid_attrs/types/{index}"
        ))
        .unwrap_or_default()
    }

    /// Open the device and port to use, or `Ok(None)` when this host has no
    /// RDMA device at all (or none passes `OXCCL_IB_HCA`).
    pub fn choose() -> Result<Option<Choice>> {
        let names = verbs::device_names()
            .map_err(|e| Error::System(format!("listing RDMA devices: {e}")))?;
        let filter = parse_hca(&env("OXCCL_IB_HCA").unwrap_or_default());
        let gid_index = match env("OXCCL_IB_GID_INDEX") {
            None => None,
            Some(_) => Some(env_num("OXCCL_IB_GID_INDEX", 0)? as u8),
        };
        let timeout = env_num("OXCCL_IB_TIMEOUT", 18)? as u8;
        let retry_cnt = env_num("OXCCL_IB_RETRY_CNT", 7)? as u8;
        let traffic_class = env_num("OXCCL_IB_TC", 0)? as u8;
        for name in names {
            let ctx = match Context::open(&name) {
                Ok(c) => c,
                Err(e) => {
                    tracing::info!("oxccl rdma: skipping {name}: {e}");
                    continue;
                }
            };
            let ports = ctx
                .port_count()
                .map_err(|e| Error::System(format!("{name}: {e}")))?;
            for port in 1..=ports {
                if !allowed(&filter, &name, port) {
                    continue;
                }
                let attr = match ctx.port(port) {
                    Ok(a) => a,
                    Err(_) => continue,
                };
                if attr.state != ffi::ibv_port_state::IBV_PORT_ACTIVE {
                    continue;
                }
                let ethernet = attr.link_layer == ffi::IBV_LINK_LAYER_ETHERNET as u8;
                let index = match gid_index {
                    Some(i) => Some(i),
                    None if ethernet => (0..attr.gid_tbl_len.max(0) as u32)
                        .filter_map(|i| {
                            let g = ctx.gid(port, i).ok()?;
                            Some((gid_rank(&g, &gid_kind(&name, port, i))?, i))
                        })
                        // Best rank, then lowest index.
                        .max_by_key(|(r, i)| (*r, std::cmp::Reverse(*i)))
                        .map(|(_, i)| i as u8),
                    None => None,
                };
                if ethernet && index.is_none() {
                    tracing::info!("oxccl rdma: {name} port {port} has no usable GID");
                    continue;
                }
                let gid = match index {
                    Some(i) => {
                        let no_gid = |why: String| {
                            Error::Config(format!(
                                "OXCCL_IB_GID_INDEX={i}: {name} port {port} has no such GID ({why})"
                            ))
                        };
                        if i as i32 >= attr.gid_tbl_len {
                            return Err(no_gid(format!("its table has {}", attr.gid_tbl_len)));
                        }
                        let g = ctx.gid(port, i as u32).map_err(|e| no_gid(e.to_string()))?;
                        if g.iter().all(|b| *b == 0) {
                            return Err(no_gid("the entry is empty".into()));
                        }
                        g
                    }
                    None => [0; 16],
                };
                tracing::info!(
                    "oxccl rdma: using {name} port {port}, {}, GID index {index:?}, MTU {}",
                    if ethernet { "RoCE" } else { "InfiniBand" },
                    128u32 << attr.active_mtu
                );
                return Ok(Some(Choice {
                    settings: QpSettings {
                        port,
                        gid_index: index,
                        mtu: attr.active_mtu,
                        timeout,
                        retry_cnt,
                        traffic_class,
                        reads_in_flight: ctx
                            .reads_in_flight()
                            .map_err(|e| Error::System(format!("RDMA device {name}: {e}")))?
                            .min(16),
                    },
                    lid: attr.lid,
                    gid,
                    ctx,
                }));
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hca_filter_follows_nccl_syntax() {
        let f = parse_hca("mlx5_0:1,=rxe0");
        assert!(allowed(&f, "mlx5_0", 1));
        assert!(!allowed(&f, "mlx5_0", 2), "port given");
        assert!(allowed(&f, "mlx5_01", 1), "prefix");
        assert!(allowed(&f, "rxe0", 1));
        assert!(!allowed(&f, "rxe01", 1), "exact");
        let f = parse_hca("^mlx5_2");
        assert!(!allowed(&f, "mlx5_2", 1));
        assert!(allowed(&f, "mlx5_1", 1));
        assert!(allowed(&parse_hca(""), "anything", 3));
    }

    #[test]
    fn roce_v2_ipv4_gids_win() {
        let v4 = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1];
        let ll = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
        assert_eq!(gid_rank(&[0; 16], "RoCE v2"), None);
        assert!(gid_rank(&v4, "RoCE v2\n") > gid_rank(&ll, "RoCE v2"));
        assert!(gid_rank(&ll, "RoCE v2") > gid_rank(&v4, "IB/RoCE v1"));
    }
}
