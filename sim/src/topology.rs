//! Hosts and ranks: `hosts` hosts of `per_host` ranks each, rank `r` on
//! host `r / per_host` (block placement, as launchers place ranks).

/// The shape of a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Topology {
    pub hosts: usize,
    pub per_host: usize,
}

impl Topology {
    pub fn new(hosts: usize, per_host: usize) -> Result<Topology, String> {
        if hosts == 0 || per_host == 0 {
            return Err(format!("a topology needs at least one host and one rank per host, got {hosts} x {per_host}"));
        }
        if hosts.checked_mul(per_host).is_none_or(|n| n > 1 << 20) {
            return Err(format!(
                "{hosts} x {per_host} ranks is more than this simulator takes (1 Mi ranks)"
            ));
        }
        Ok(Topology { hosts, per_host })
    }

    pub fn nranks(&self) -> usize {
        self.hosts * self.per_host
    }

    pub fn host_of(&self, rank: usize) -> usize {
        rank / self.per_host
    }
}
