//! NCCL's environment variables, read as oxccl's where they mean the same.
//!
//! A program written against NCCL (through `libnccl.so.2`, the `nccl-abi`
//! crate) comes with NCCL's settings: `NCCL_SOCKET_IFNAME`, `NCCL_IB_HCA`,
//! `NCCL_ALGO`, ... The NCCL library turns this on once
//! ([`honour_nccl_names`]); from then on an `OXCCL_*` variable that is not
//! set takes its value from the NCCL variable of the same meaning,
//! translated where the spelling differs, and the `OXCCL_*` name wins when
//! both are set. A Rust program using oxccl directly never reads them: in a
//! job that also runs NVIDIA's NCCL on its GPUs, `NCCL_ALGO=Tree` is meant
//! for that library, not this one.

use std::sync::atomic::{AtomicBool, Ordering};

/// One NCCL variable and the `OXCCL_*` one it stands for.
#[derive(Debug)]
pub struct Alias {
    pub oxccl: &'static str,
    pub nccl: &'static str,
    /// NCCL's value in oxccl's spelling, or why it has none.
    pub translate: fn(&str) -> Result<String, String>,
}

fn same(v: &str) -> Result<String, String> {
    Ok(v.to_string())
}

/// `NCCL_DEBUG`'s levels as `OXCCL_DEBUG`'s.
fn debug(v: &str) -> Result<String, String> {
    Ok(match v.to_ascii_uppercase().as_str() {
        "VERSION" | "WARN" => "warn",
        "INFO" => "info",
        "ABORT" => "error",
        "TRACE" => "trace",
        _ => return Err("expected VERSION, WARN, INFO, ABORT or TRACE".into()),
    }
    .into())
}

/// `NCCL_ALGO`: a list of NCCL's algorithm names (optionally per
/// collective, `allreduce:tree;...`). oxccl runs the first one it has:
/// `Ring` as `ring`, `Tree` as `dbtree` (NCCL's tree is a double binary
/// tree); NVLS, CollNet and PAT have no host counterpart. A list to
/// exclude (`^...`) or per collective cannot be honoured by one forced
/// algorithm and is refused rather than half-applied.
fn algo(v: &str) -> Result<String, String> {
    if v.starts_with('^') || v.contains(':') || v.contains(';') {
        return Err("exclusion lists and per-collective lists are not mapped; \
                    set OXCCL_ALGO instead"
            .into());
    }
    for name in v.split(',').map(str::trim) {
        match name.to_ascii_lowercase().as_str() {
            "ring" => return Ok("ring".into()),
            "tree" => return Ok("dbtree".into()),
            _ => {}
        }
    }
    Err("none of these is Ring or Tree (NVLS, CollNet and PAT have no host counterpart)".into())
}

/// The variables mapped. Everything else of NCCL's (NVLink, CUDA, CTA and
/// channel settings) has no host-memory meaning and is not read.
pub const ALIASES: &[Alias] = &[
    Alias {
        oxccl: "OXCCL_ALGO",
        nccl: "NCCL_ALGO",
        translate: algo,
    },
    Alias {
        oxccl: "OXCCL_BUFFSIZE",
        nccl: "NCCL_BUFFSIZE",
        translate: same,
    },
    Alias {
        oxccl: "OXCCL_DEBUG",
        nccl: "NCCL_DEBUG",
        translate: debug,
    },
    Alias {
        oxccl: "OXCCL_HOSTID",
        nccl: "NCCL_HOSTID",
        translate: same,
    },
    Alias {
        oxccl: "OXCCL_IB_GID_INDEX",
        nccl: "NCCL_IB_GID_INDEX",
        translate: same,
    },
    Alias {
        oxccl: "OXCCL_IB_HCA",
        nccl: "NCCL_IB_HCA",
        translate: same,
    },
    Alias {
        oxccl: "OXCCL_IB_RETRY_CNT",
        nccl: "NCCL_IB_RETRY_CNT",
        translate: same,
    },
    Alias {
        oxccl: "OXCCL_IB_TC",
        nccl: "NCCL_IB_TC",
        translate: same,
    },
    Alias {
        oxccl: "OXCCL_IB_TIMEOUT",
        nccl: "NCCL_IB_TIMEOUT",
        translate: same,
    },
    Alias {
        oxccl: "OXCCL_SOCKET_IFNAME",
        nccl: "NCCL_SOCKET_IFNAME",
        translate: same,
    },
];

static HONOURED: AtomicBool = AtomicBool::new(false);

/// From now on, read NCCL's variables for the `OXCCL_*` ones that are not
/// set (the NCCL library calls it; idempotent).
pub fn honour_nccl_names() {
    HONOURED.store(true, Ordering::Relaxed);
}

/// Whether NCCL's variables are read.
pub fn honoured() -> bool {
    HONOURED.load(Ordering::Relaxed)
}

/// The alias of `oxccl`, if it has one.
pub fn alias_of(oxccl: &str) -> Option<&'static Alias> {
    ALIASES.iter().find(|a| a.oxccl == oxccl)
}

/// Where a value came from: `OXCCL_*` itself, or NCCL's variable (its
/// name and value as set).
#[derive(Clone, Debug, PartialEq)]
pub enum Source {
    Oxccl,
    Nccl { name: &'static str, raw: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ncclalgo_maps_what_it_can_and_refuses_the_rest() {
        assert_eq!(algo("Ring").unwrap(), "ring");
        assert_eq!(algo("tree").unwrap(), "dbtree");
        assert_eq!(algo("NVLS,Tree").unwrap(), "dbtree");
        assert!(algo("NVLS").unwrap_err().contains("NVLS"));
        assert!(algo("^Tree").is_err());
        assert!(algo("allreduce:tree").is_err());
        assert_eq!(debug("info").unwrap(), "info");
        assert!(debug("loud").is_err());
    }

    #[test]
    fn aliases_name_real_variables_once() {
        for (i, a) in ALIASES.iter().enumerate() {
            super::super::vars::var(a.oxccl);
            assert!(ALIASES[..i].iter().all(|b| b.oxccl != a.oxccl));
        }
    }
}
