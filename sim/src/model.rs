//! The cost model: what each kind of step costs, per level of the
//! topology. Times are seconds, rates bytes per second.
//!
//! A rank is one thread (as in the runtime: one thread drives a call), so
//! everything it does with its CPU is serial: the overhead of each message,
//! copying a message into or out of a shared-memory ring, handing it to or
//! taking it from a socket, local copies and reductions. Between hosts a
//! message also crosses the sender host's NIC, the wire (latency `alpha`)
//! and the receiver host's NIC, each NIC one direction at `nic_rate`,
//! shared by every message of the host in that direction (first come,
//! first served). CPU work of the ranks of a host runs on `cores` cores
//! of that host, or of the whole machine when `shared_cores` (hosts
//! emulated by network namespaces of one machine share its cores). Where
//! ranks outnumber their cores, a rank that ran out of work and waits for
//! a message sleeps (the runtime yields its core rather than spin) and
//! runs again `wake` after the message is there: the scheduler's wake-up.
//! With a core each, ranks spin and `wake` is not paid.

use std::fmt;

/// Costs of one machine and network.
#[derive(Clone, Debug, PartialEq)]
pub struct Model {
    /// CPU time per message and side (executor bookkeeping, a ring's
    /// header, a system call's fixed part).
    pub msg_overhead: f64,
    /// CPU time of a local step's fixed part.
    pub step_overhead: f64,
    /// Latency from a shared-memory ring's write to its reader seeing it.
    pub shm_alpha: f64,
    /// Bytes per second one rank copies (into or out of a ring, locally).
    pub copy_rate: f64,
    /// Bytes of output per second of a two-input reduction.
    pub reduce_rate: f64,
    /// Bytes per second of CPU time to hand a message to a socket or take
    /// it from one (each side pays it).
    pub socket_rate: f64,
    /// One-way latency between hosts (wire, switch, receive path).
    pub alpha: f64,
    /// Bytes per second of one host's NIC, each direction.
    pub nic_rate: f64,
    /// Cores serving the ranks' CPU work (0: one per rank, never shared).
    pub cores: usize,
    /// `cores` belong to the whole machine, not to each host.
    pub shared_cores: bool,
    /// From a message's arrival to its sleeping receiver running again,
    /// where ranks outnumber cores.
    pub wake: f64,
}

impl Default for Model {
    /// A plausible cluster: 25 GB/s-class NICs (200 Gbit/s), 5 µs between
    /// hosts, copies at 10 GB/s, a core per rank.
    fn default() -> Model {
        Model {
            msg_overhead: 0.5e-6,
            step_overhead: 0.1e-6,
            shm_alpha: 0.3e-6,
            copy_rate: 10e9,
            reduce_rate: 8e9,
            socket_rate: 10e9,
            alpha: 5e-6,
            nic_rate: 25e9,
            cores: 0,
            shared_cores: false,
            wake: 0.0,
        }
    }
}

/// A setting that could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadSetting(pub String);

impl fmt::Display for BadSetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadSetting {}

/// The settable fields, their kinds and meanings (for `--help` and errors).
pub const FIELDS: &[(&str, &str, &str)] = &[
    ("msg_overhead", "time", "CPU time per message and side"),
    (
        "step_overhead",
        "time",
        "CPU time of a local step's fixed part",
    ),
    ("shm_alpha", "time", "shared-memory latency"),
    ("copy_rate", "rate", "bytes/s one rank copies"),
    (
        "reduce_rate",
        "rate",
        "output bytes/s of a two-input reduction",
    ),
    (
        "socket_rate",
        "rate",
        "CPU bytes/s to write or read a socket",
    ),
    ("alpha", "time", "one-way latency between hosts"),
    (
        "nic_rate",
        "rate",
        "bytes/s of a host's NIC, each direction",
    ),
    (
        "cores",
        "count",
        "cores serving the ranks (0: one per rank)",
    ),
    (
        "shared_cores",
        "bool",
        "cores are the machine's, not each host's",
    ),
    (
        "wake",
        "time",
        "oversubscribed cores: a message's arrival to its sleeping receiver running",
    ),
];

impl Model {
    /// Set one field from text: times as `5us`, `1.5ms`, `200ns`, `0`;
    /// rates as `10Gbit`, `25GB/s`, `4GiB/s`, `800MB/s`.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), BadSetting> {
        let t = || parse_time(value).map_err(|e| BadSetting(format!("{key} = {value:?}: {e}")));
        let r = || parse_rate(value).map_err(|e| BadSetting(format!("{key} = {value:?}: {e}")));
        match key {
            "msg_overhead" => self.msg_overhead = t()?,
            "step_overhead" => self.step_overhead = t()?,
            "shm_alpha" => self.shm_alpha = t()?,
            "copy_rate" => self.copy_rate = r()?,
            "reduce_rate" => self.reduce_rate = r()?,
            "socket_rate" => self.socket_rate = r()?,
            "alpha" => self.alpha = t()?,
            "nic_rate" => self.nic_rate = r()?,
            "wake" => self.wake = t()?,
            "cores" => {
                self.cores = value
                    .parse()
                    .map_err(|_| BadSetting(format!("cores = {value:?}: not a count")))?
            }
            "shared_cores" => {
                self.shared_cores = match value {
                    "true" | "yes" | "1" => true,
                    "false" | "no" | "0" => false,
                    _ => {
                        return Err(BadSetting(format!(
                            "shared_cores = {value:?}: not true/false"
                        )))
                    }
                }
            }
            _ => {
                let known: Vec<&str> = FIELDS.iter().map(|f| f.0).collect();
                return Err(BadSetting(format!(
                    "unknown setting {key:?} (known: {})",
                    known.join(", ")
                )));
            }
        }
        Ok(())
    }

    /// Read a profile: `key = value` lines, `#` comments, blank lines.
    /// All or nothing: on an error the model is unchanged.
    pub fn load(&mut self, text: &str) -> Result<(), BadSetting> {
        let mut new = self.clone();
        for (i, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let (k, v) = line.split_once('=').ok_or_else(|| {
                BadSetting(format!("line {}: {line:?} is not key = value", i + 1))
            })?;
            new.set(k.trim(), v.trim())
                .map_err(|e| BadSetting(format!("line {}: {e}", i + 1)))?;
        }
        *self = new;
        Ok(())
    }

    /// The profile text of this model (what [`Model::load`] reads).
    pub fn to_profile(&self) -> String {
        format!(
            "msg_overhead = {}\nstep_overhead = {}\nshm_alpha = {}\ncopy_rate = {}\n\
             reduce_rate = {}\nsocket_rate = {}\nalpha = {}\nnic_rate = {}\ncores = {}\n\
             shared_cores = {}\nwake = {}\n",
            show_time(self.msg_overhead),
            show_time(self.step_overhead),
            show_time(self.shm_alpha),
            show_rate(self.copy_rate),
            show_rate(self.reduce_rate),
            show_rate(self.socket_rate),
            show_time(self.alpha),
            show_rate(self.nic_rate),
            self.cores,
            self.shared_cores,
            show_time(self.wake)
        )
    }
}

fn number(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number"))?;
    if !v.is_finite() || v < 0.0 {
        return Err(format!("{s:?} is not a finite, non-negative number"));
    }
    Ok(v)
}

/// `5us`, `1.5ms`, `200ns`, `2s`, `0`.
pub fn parse_time(s: &str) -> Result<f64, String> {
    let s = s.trim();
    // Divisors, not factors: 50 / 1e6 is the double nearest 50 µs, 50 * 1e-6 is not.
    let units = [
        ("ns", 1e9),
        ("us", 1e6),
        ("µs", 1e6),
        ("ms", 1e3),
        ("s", 1.0),
    ];
    for (u, d) in units {
        if let Some(n) = s.strip_suffix(u) {
            return Ok(number(n)? / d);
        }
    }
    if number(s)? == 0.0 {
        return Ok(0.0);
    }
    Err(format!("{s:?} needs a unit (ns, us, ms, s)"))
}

/// `10Gbit`, `25GB/s`, `4GiB/s`, `800MB/s`, `100Mbit`: bytes per second.
pub fn parse_rate(s: &str) -> Result<f64, String> {
    let s = s.trim();
    let units = [
        ("Gbit", 1e9 / 8.0),
        ("Mbit", 1e6 / 8.0),
        ("GiB/s", (1u64 << 30) as f64),
        ("MiB/s", (1u64 << 20) as f64),
        ("GB/s", 1e9),
        ("MB/s", 1e6),
        ("B/s", 1.0),
    ];
    for (u, f) in units {
        if let Some(n) = s.strip_suffix(u) {
            let v = number(n)? * f;
            if v == 0.0 {
                return Err(format!("{s:?}: a rate must be above zero"));
            }
            return Ok(v);
        }
    }
    Err(format!(
        "{s:?} needs a unit (Gbit, Mbit, GB/s, MB/s, GiB/s, MiB/s, B/s)"
    ))
}

/// A time as `parse_time` reads it back.
pub fn show_time(t: f64) -> String {
    format!("{}ns", (t * 1e9 * 1000.0).round() / 1000.0)
}

/// A rate as `parse_rate` reads it back.
pub fn show_rate(r: f64) -> String {
    format!("{}MB/s", (r / 1e6 * 1000.0).round() / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_parse_and_a_profile_round_trips() {
        assert_eq!(parse_time("50us"), Ok(50e-6));
        assert_eq!(parse_time("0"), Ok(0.0));
        assert_eq!(parse_rate("10Gbit"), Ok(1.25e9));
        assert_eq!(parse_rate("2GiB/s"), Ok(2.0 * (1u64 << 30) as f64));
        let mut m = Model::default();
        m.set("alpha", "50us").unwrap();
        m.set("nic_rate", "10Gbit").unwrap();
        m.set("cores", "2").unwrap();
        m.set("shared_cores", "true").unwrap();
        let mut back = Model::default();
        back.load(&m.to_profile()).unwrap();
        assert_eq!(back, m);
    }

    #[test]
    fn bad_settings_are_named() {
        let mut m = Model::default();
        for (k, v, want) in [
            ("alpha", "50", "needs a unit"),
            ("alpha", "-1us", "non-negative"),
            ("nic_rate", "0Gbit", "above zero"),
            ("nic_rate", "fast", "needs a unit"),
            ("cores", "two", "not a count"),
            ("speed", "1", "unknown setting \"speed\""),
        ] {
            let e = m.set(k, v).unwrap_err().0;
            assert!(e.contains(want) && e.contains(k), "{k} = {v}: {e}");
        }
        let e = m.load("alpha = 5us\nnonsense\n").unwrap_err().0;
        assert!(e.starts_with("line 2"), "{e}");
        assert_eq!(m, Model::default(), "a failed load changed the model");
    }
}
