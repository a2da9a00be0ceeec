//! Hosts and ranks: `hosts` hosts of `per_host` ranks each, rank `r` on
//! host `r / per_host` (block placement, as launchers place ranks), or any
//! placement given rank by rank (what a running job reports).

/// The shape of a job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    pub hosts: usize,
    /// Ranks per host in block placement (for a placement given rank by
    /// rank: the most ranks any host has).
    pub per_host: usize,
    /// The host of each rank, when the placement is not blocks of `per_host`.
    map: Option<Vec<u32>>,
}

/// Most ranks the simulator takes.
pub const MAX_RANKS: usize = 1 << 20;

impl Topology {
    /// `hosts` hosts of `per_host` ranks, in blocks.
    pub fn new(hosts: usize, per_host: usize) -> Result<Topology, String> {
        if hosts == 0 || per_host == 0 {
            return Err(format!("a topology needs at least one host and one rank per host, got {hosts} x {per_host}"));
        }
        if hosts.checked_mul(per_host).is_none_or(|n| n > MAX_RANKS) {
            return Err(format!(
                "{hosts} x {per_host} ranks is more than this simulator takes ({MAX_RANKS} ranks)"
            ));
        }
        Ok(Topology {
            hosts,
            per_host,
            map: None,
        })
    }

    /// Rank `r` on host `host[r]` (hosts numbered by first appearance,
    /// whatever the values). Blocks of equal size become [`Topology::new`]'s.
    pub fn from_hosts<T: Eq + std::hash::Hash>(host: &[T]) -> Result<Topology, String> {
        if host.is_empty() || host.len() > MAX_RANKS {
            return Err(format!(
                "{} ranks: a topology takes 1 to {MAX_RANKS}",
                host.len()
            ));
        }
        let mut seen: std::collections::HashMap<&T, u32> = std::collections::HashMap::new();
        let mut map = Vec::with_capacity(host.len());
        for h in host {
            let next = seen.len() as u32;
            map.push(*seen.entry(h).or_insert(next));
        }
        let hosts = seen.len();
        let mut count = vec![0usize; hosts];
        for &h in &map {
            count[h as usize] += 1;
        }
        let per_host = count.iter().copied().max().unwrap_or(1);
        let blocks = map.len() == hosts * per_host
            && map
                .iter()
                .enumerate()
                .all(|(r, &h)| h as usize == r / per_host);
        Ok(Topology {
            hosts,
            per_host,
            map: (!blocks).then_some(map),
        })
    }

    /// Block placement of equal hosts (what periodic simulation needs).
    pub fn is_blocks(&self) -> bool {
        self.map.is_none()
    }

    /// The placement as schedules see it (for hierarchical algorithms):
    /// blocks, round robin, or `None` for uneven hosts.
    pub fn layout(&self) -> Option<algorithms::Layout> {
        match &self.map {
            None => Some(algorithms::Layout {
                per_host: self.per_host,
                cyclic: false,
            }),
            Some(m) => algorithms::Layout::of_hosts(m),
        }
    }

    pub fn nranks(&self) -> usize {
        match &self.map {
            Some(m) => m.len(),
            None => self.hosts * self.per_host,
        }
    }

    pub fn host_of(&self, rank: usize) -> usize {
        match &self.map {
            Some(m) => m[rank] as usize,
            None => rank / self.per_host,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placements_given_rank_by_rank() {
        let t = Topology::from_hosts(&[7u64, 7, 9, 9]).unwrap();
        assert_eq!(t, Topology::new(2, 2).unwrap());
        let t = Topology::from_hosts(&["a", "b", "a", "b", "b"]).unwrap();
        assert!(!t.is_blocks());
        assert_eq!((t.hosts, t.per_host, t.nranks()), (2, 3, 5));
        assert_eq!(
            (0..5).map(|r| t.host_of(r)).collect::<Vec<_>>(),
            [0, 1, 0, 1, 1]
        );
        assert!(Topology::from_hosts::<u8>(&[]).is_err());
        assert!(Topology::new(0, 4).is_err() && Topology::new(1 << 11, 1 << 10).is_err());
    }
}
