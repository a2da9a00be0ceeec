//! Output: nccl-tests' text format byte for byte (preamble, header, rows,
//! footer), plus JSON (`-J`) and CSV (`--csv`) records of the same rows.

use std::fmt::Write as _;

/// `getFloatStr` of nccl-tests: fit `value` in `width` columns, fewer
/// decimals as it grows, scientific past that.
pub fn float_str(value: f64, width: usize) -> String {
    let mut power = 0usize;
    let mut val: u64 = 1;
    while value >= val as f64 && power < 20 {
        power += 1;
        val = val.saturating_mul(10);
    }
    if power + 2 < width {
        format!("{value:>width$.2}")
    } else if power + 1 < width {
        format!("{value:>width$.1}")
    } else if power < width + 1 {
        format!("{value:>width$.0}")
    } else {
        format!("{:>width$}", c_exp(value, if width >= 7 { 1 } else { 0 }))
    }
}

/// C's `%.*e`: mantissa, `e`, sign, at least two exponent digits.
pub fn c_exp(value: f64, prec: usize) -> String {
    let s = format!("{value:.prec$e}");
    let (m, e) = s.split_once('e').unwrap_or((&s, "0"));
    let e: i32 = e.parse().unwrap_or(0);
    format!("{m}e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs())
}

/// C's `%g` (6 significant digits, trailing zeros removed).
pub fn c_g(value: f64) -> String {
    if value == 0.0 {
        return "0".into();
    }
    if !value.is_finite() {
        return if value.is_nan() {
            "nan".into()
        } else if value > 0.0 {
            "inf".into()
        } else {
            "-inf".into()
        };
    }
    let exp = value.abs().log10().floor() as i32;
    let strip = |s: String| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    };
    if !(-4..6).contains(&exp) {
        let s = format!("{value:.5e}");
        let (m, e) = s.split_once('e').unwrap();
        let e: i32 = e.parse().unwrap();
        format!(
            "{}e{}{:02}",
            strip(m.to_string()),
            if e < 0 { '-' } else { '+' },
            e.abs()
        )
    } else {
        let decimals = (5 - exp).max(0) as usize;
        strip(format!("{value:.decimals$}"))
    }
}

/// One measured direction (out-of-place or in-place).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Measure {
    pub time_us: f64,
    pub algbw: f64,
    pub busbw: f64,
    /// `None` when not checked.
    pub wrong: Option<u64>,
}

/// One output row.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub bytes: usize,
    pub count: usize,
    pub dtype: String,
    pub redop: String,
    pub root: i64,
    pub oop: Measure,
    pub ip: Measure,
    /// Which run (dtype/op/cycle) the row belongs to, for plots.
    pub series: String,
    /// The algorithm that ran the out-of-place calls (empty: unknown).
    pub algorithm: String,
}

/// The text of one row, as nccl-tests prints it (no newline).
pub fn row_line(r: &Row) -> String {
    let mut s = format!(
        "{:>12}  {:>12}  {:>8}  {:>6}  {:>6}",
        r.bytes, r.count, r.dtype, r.redop, r.root
    );
    for m in [&r.oop, &r.ip] {
        let t = float_str(m.time_us, 7);
        let a = float_str(m.algbw, 6);
        let b = float_str(m.busbw, 6);
        match m.wrong {
            Some(w) => write!(s, "  {t:>7}  {a:>6}  {b:>6}  {:>6}", c_g(w as f64)).unwrap(),
            None => write!(s, "  {t:>7}  {a:>6}  {b:>6}    N/A").unwrap(),
        }
    }
    s
}

/// The three header lines (after a `#` line).
pub fn header() -> String {
    let mut s = String::from("#\n");
    writeln!(
        s,
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}           out-of-place                       in-place          ",
        "", "", "", "", ""
    )
    .unwrap();
    writeln!(
        s,
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6} ",
        "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong"
    )
    .unwrap();
    writeln!(
        s,
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6} ",
        "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", ""
    )
    .unwrap();
    s
}

/// The footer lines.
/// Which algorithm ran which sizes, as comment lines (`# Algorithm: ring
/// for 32768-268435456 B`), in size order, one line per run of sizes; empty
/// when no row knows its algorithm. nccl-tests has no such line; parsers
/// skip `#` lines.
pub fn algorithms(rows: &[Row]) -> String {
    let mut s = String::new();
    let mut run: Option<(&str, usize, usize)> = None;
    let flush = |run: Option<(&str, usize, usize)>, s: &mut String| {
        if let Some((a, lo, hi)) = run {
            writeln!(s, "# Algorithm: {a} for {lo}-{hi} B").unwrap();
        }
    };
    for r in rows.iter().filter(|r| !r.algorithm.is_empty()) {
        run = match run {
            Some((a, lo, _)) if a == r.algorithm => Some((a, lo, r.bytes)),
            other => {
                flush(other, &mut s);
                Some((&r.algorithm, r.bytes, r.bytes))
            }
        };
    }
    flush(run, &mut s);
    s
}

pub fn footer(wrong_total: u64, avg_busbw: f64, program: &str) -> String {
    let mut s = String::new();
    writeln!(s, "# {:<20} : 0 OK", "Out of bounds values").unwrap();
    writeln!(s, "# {:<20} : {} ", "Avg bus bandwidth", c_g(avg_busbw)).unwrap();
    writeln!(s, "#").unwrap();
    writeln!(s, "# Collective test concluded: {program}").unwrap();
    if wrong_total > 0 {
        writeln!(s, "# error: {wrong_total} wrong elements").unwrap();
    }
    s
}

fn json_str(s: &str) -> String {
    let mut o = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            '\t' => o.push_str("\\t"),
            c if (c as u32) < 0x20 => write!(o, "\\u{:04x}", c as u32).unwrap(),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

fn json_num(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.6}")
    } else {
        "\"nan\"".into()
    }
}

fn json_measure(m: &Measure) -> String {
    format!(
        "{{\"time\":{},\"alg_bw\":{},\"bus_bw\":{},\"nwrong\":{}}}",
        json_num(m.time_us),
        json_num(m.algbw),
        json_num(m.busbw),
        m.wrong.map_or("null".into(), |w| w.to_string())
    )
}

/// A JSON document in the shape of nccl-tests' `-J` output (version 2).
pub struct JsonDoc {
    pub program: String,
    pub args: Vec<String>,
    pub nranks: usize,
    pub devices: Vec<(usize, u32, String)>,
    pub min_bytes: usize,
    pub max_bytes: usize,
    pub iters: usize,
    pub warmup_iters: usize,
    pub check: bool,
}

impl JsonDoc {
    /// Render with the rows and the summary.
    pub fn render(&self, rows: &[Row], wrong_total: u64, avg_busbw: f64) -> String {
        let mut s = String::from("{\"version\":2");
        write!(s, ",\"program\":{}", json_str(&self.program)).unwrap();
        let args: Vec<String> = self.args.iter().map(|a| json_str(a)).collect();
        write!(s, ",\"args\":[{}]", args.join(",")).unwrap();
        write!(
            s,
            ",\"config\":{{\"nranks\":{},\"minimum_bytes\":{},\"maximum_bytes\":{},\"iterations\":{},\"warmup_iters\":{},\"validation\":{},\"devices\":[{}]}}",
            self.nranks,
            self.min_bytes,
            self.max_bytes,
            self.iters,
            self.warmup_iters,
            u8::from(self.check),
            self.devices
                .iter()
                .map(|(r, pid, host)| format!(
                    "{{\"rank\":{r},\"group\":0,\"pid\":{pid},\"hostname\":{},\"device\":{r},\"device_hex\":\"cpu\",\"device_info\":\"host memory\"}}",
                    json_str(host)
                ))
                .collect::<Vec<_>>()
                .join(",")
        )
        .unwrap();
        let rows: Vec<String> = rows
            .iter()
            .map(|r| {
                format!(
                    "{{\"size\":{},\"count\":{},\"type\":{},\"redop\":{},\"root\":{},\"out_of_place\":{},\"in_place\":{},\"algorithm\":{}}}",
                    r.bytes,
                    r.count,
                    json_str(&r.dtype),
                    json_str(&r.redop),
                    json_str(&r.root.to_string()),
                    json_measure(&r.oop),
                    json_measure(&r.ip),
                    json_str(&r.algorithm)
                )
            })
            .collect();
        write!(s, ",\"results\":[{}]", rows.join(",")).unwrap();
        write!(
            s,
            ",\"out_of_bounds\":{{\"count\":0,\"okay\":\"true\"}},\"wrong_elements\":{wrong_total},\"average_bus_bandwidth\":{{\"bandwidth\":{},\"okay\":\"unchecked\"}}}}",
            json_num(avg_busbw)
        )
        .unwrap();
        s.push('\n');
        s
    }
}

/// CSV of the rows (one header line).
pub fn csv(program: &str, nranks: usize, rows: &[Row]) -> String {
    let mut s = String::from(
        "collective,nranks,size_bytes,count,type,redop,root,oop_time_us,oop_algbw_gbs,oop_busbw_gbs,oop_wrong,ip_time_us,ip_algbw_gbs,ip_busbw_gbs,ip_wrong\n",
    );
    let w = |m: &Measure| m.wrong.map_or(String::new(), |w| w.to_string());
    for r in rows {
        writeln!(
            s,
            "{program},{nranks},{},{},{},{},{},{:.3},{:.4},{:.4},{},{:.3},{:.4},{:.4},{}",
            r.bytes,
            r.count,
            r.dtype,
            r.redop,
            r.root,
            r.oop.time_us,
            r.oop.algbw,
            r.oop.busbw,
            w(&r.oop),
            r.ip.time_us,
            r.ip.algbw,
            r.ip.busbw,
            w(&r.ip)
        )
        .unwrap();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn number_formats_match_c() {
        assert_eq!(float_str(10.52, 7), "  10.52");
        assert_eq!(float_str(1211.2, 7), "1211.20");
        assert_eq!(float_str(12345.6, 7), "12345.6");
        assert_eq!(float_str(123456.0, 7), " 123456");
        assert_eq!(float_str(12345678.0, 7), "1.2e+07");
        assert_eq!(float_str(0.0, 6), "  0.00");
        assert_eq!(float_str(110.81, 6), "110.81");
        assert_eq!(float_str(1234.5, 6), "1234.5");
        assert_eq!(float_str(12345.4, 6), " 12345");
        assert_eq!(c_g(0.0), "0");
        assert_eq!(c_g(3.0), "3");
        assert_eq!(c_g(2.72845), "2.72845");
        assert_eq!(c_g(1234567.0), "1.23457e+06");
        assert_eq!(c_exp(0.000123, 1), "1.2e-04");
    }

    #[test]
    fn row_layout_matches_nccl_tests() {
        // `%12li  %12li  %8s  %6s  %6s`, then per direction `  %7s  %6s  %6s  %6g`
        // (or `    N/A`), as nccl-tests' writeBenchmarkLine* print them.
        let m = Measure {
            time_us: 1211.2,
            algbw: 110.81,
            busbw: 110.81,
            wrong: Some(0),
        };
        let r = Row {
            bytes: 134217728,
            count: 33554432,
            dtype: "float".into(),
            redop: "sum".into(),
            root: -1,
            oop: m,
            ip: Measure { wrong: None, ..m },
            series: String::new(),
            algorithm: String::new(),
        };
        assert_eq!(
            row_line(&r),
            "   134217728      33554432     float     sum      -1  1211.20  110.81  110.81       0  1211.20  110.81  110.81    N/A"
        );
    }
}
