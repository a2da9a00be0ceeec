//! Range-checked parsing of one setting's text, shared by environment
//! variables and command-line flags. Every error names the setting, the
//! value given and what is accepted, and nothing here panics or overflows
//! on any input (`1e300`, `inf`, `NaN`, `-0`, 30-digit integers).

use crate::error::{Error, Result};
use std::time::{Duration, Instant};

/// Longest duration any setting accepts: one year. Deadlines are computed
/// as `now + duration`; capping here keeps that sum far from overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// `now + d`, saturating: a caller's duration (`Work::wait_timeout`,
/// `with_timeout`, a peer's announced wait) can be anything up to
/// `Duration::MAX`, and `Instant + Duration` panics on overflow. Durations
/// beyond [`MAX_DURATION`] wait that long, which is "forever" in practice.
pub fn deadline_after(d: Duration) -> Instant {
    deadline_after_from(Instant::now(), d)
}

/// [`deadline_after`] counted from `now` (for code that is handed the time).
pub fn deadline_after_from(now: Instant, d: Duration) -> Instant {
    now.checked_add(d.min(MAX_DURATION)).unwrap_or(now)
}

fn bad(name: &str, raw: &str, accepted: &str) -> Error {
    Error::Config(format!("{name}={raw:?}: {accepted}"))
}

/// A duration given in `unit_secs` units (1.0 for seconds, 1e-6 for
/// microseconds), between `min` and `max` inclusive.
pub fn duration(
    name: &str,
    raw: &str,
    unit_secs: f64,
    min: Duration,
    max: Duration,
) -> Result<Duration> {
    let unit = if unit_secs == 1.0 { "seconds" } else { "µs" };
    let show = |d: Duration| format!("{}", d.as_secs_f64() / unit_secs);
    let accepted = || {
        format!(
            "expected a number of {unit} from {} to {}",
            show(min),
            show(max)
        )
    };
    let x = raw
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|x| x.is_finite())
        .ok_or_else(|| bad(name, raw, &accepted()))?;
    let secs = x * unit_secs;
    // Compare as floats first: `Duration::from_secs_f64` panics on values
    // out of its range, and these bounds are far inside it.
    if !(min.as_secs_f64()..=max.as_secs_f64()).contains(&secs) {
        return Err(bad(name, raw, &accepted()));
    }
    Ok(Duration::from_secs_f64(secs).clamp(min, max))
}

/// A whole number from `min` to `max` inclusive (no sign, no fraction).
pub fn count(name: &str, raw: &str, min: usize, max: usize) -> Result<usize> {
    raw.trim()
        .parse::<usize>()
        .ok()
        .filter(|n| (min..=max).contains(n))
        .ok_or_else(|| {
            bad(
                name,
                raw,
                &format!("expected a whole number from {min} to {max}"),
            )
        })
}

/// A byte size with an optional K/M/G suffix, from `min` to `max` bytes.
pub fn size(name: &str, raw: &str, min: usize, max: usize) -> Result<usize> {
    parse_bytes(raw)
        .filter(|n| (min..=max).contains(n))
        .ok_or_else(|| {
            bad(
                name,
                raw,
                &format!(
                    "expected a size from {} to {} (bytes, or with a K/M/G suffix)",
                    show_bytes(min),
                    show_bytes(max)
                ),
            )
        })
}

/// One of `choices` (compared case-insensitively); returns the canonical
/// spelling from `choices`.
pub fn choice<'c>(name: &str, raw: &str, choices: &[&'c str]) -> Result<&'c str> {
    let v = raw.trim();
    choices
        .iter()
        .find(|c| c.eq_ignore_ascii_case(v))
        .copied()
        .ok_or_else(|| {
            bad(
                name,
                raw,
                &format!("expected one of {}", choices.join(", ")),
            )
        })
}

/// Parse a byte size with an optional K/M/G suffix (powers of 1024).
pub fn parse_bytes(v: &str) -> Option<usize> {
    let v = v.trim();
    let (num, mul) = match v.char_indices().last()? {
        (i, 'k' | 'K') => (&v[..i], 1usize << 10),
        (i, 'm' | 'M') => (&v[..i], 1 << 20),
        (i, 'g' | 'G') => (&v[..i], 1 << 30),
        _ => (v, 1),
    };
    num.trim().parse::<usize>().ok()?.checked_mul(mul)
}

/// `n` bytes as the shortest exact K/M/G spelling.
pub fn show_bytes(n: usize) -> String {
    for (shift, suffix) in [(30, "G"), (20, "M"), (10, "K")] {
        if n >= 1 << shift && n.is_multiple_of(1 << shift) {
            return format!("{}{suffix}", n >> shift);
        }
    }
    n.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes_parse_with_suffixes() {
        assert_eq!(parse_bytes("64M"), Some(64 << 20));
        // As sysfs writes cache sizes (sys::last_level_cache), newline too.
        assert_eq!(parse_bytes("8192K\n"), Some(8 << 20));
        assert_eq!(parse_bytes("8"), Some(8));
        assert_eq!(parse_bytes("4k"), Some(4096));
        assert_eq!(parse_bytes("1G"), Some(1 << 30));
        assert_eq!(parse_bytes("x"), None);
        assert_eq!(parse_bytes(""), None);
        assert_eq!(parse_bytes("99999999999999999999G"), None);
        assert_eq!(show_bytes(4096), "4K");
        assert_eq!(show_bytes(1 << 30), "1G");
        assert_eq!(show_bytes(1000), "1000");
    }

    #[test]
    fn hostile_numbers_are_errors_naming_the_setting() {
        let (lo, hi) = (Duration::from_millis(1), MAX_DURATION);
        for raw in [
            "1e300", "inf", "-inf", "NaN", "-1", "1e-12", "0", "1e19", "", "x",
        ] {
            let e = duration("OXCCL_TIMEOUT", raw, 1.0, lo, hi).unwrap_err();
            let text = e.to_string();
            assert!(text.contains("OXCCL_TIMEOUT"), "{text}");
            assert!(text.contains("31536000"), "{text}");
        }
        assert_eq!(
            duration("T", "2.5", 1.0, lo, hi).unwrap(),
            Duration::from_millis(2500)
        );
        assert_eq!(
            duration("S", "50", 1e-6, Duration::ZERO, Duration::from_secs(1)).unwrap(),
            Duration::from_micros(50)
        );
        for raw in ["1.5", "-1", "0", "17", "99999999999999999999999"] {
            assert!(count("OXCCL_NSOCKS", raw, 1, 16)
                .unwrap_err()
                .to_string()
                .contains("OXCCL_NSOCKS"));
        }
        assert_eq!(count("N", " 4 ", 1, 16).unwrap(), 4);
        assert!(size("B", "1", 4096, 1 << 30).is_err());
        assert_eq!(size("B", "64K", 4096, 1 << 30).unwrap(), 64 << 10);
        assert_eq!(choice("I", "AVX2", &["baseline", "avx2"]).unwrap(), "avx2");
        assert!(choice("I", "foo", &["baseline", "avx2"])
            .unwrap_err()
            .to_string()
            .contains("baseline, avx2"));
    }
}
