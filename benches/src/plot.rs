//! SVG plots of benchmark rows: bus bandwidth against size (left) and time
//! against size (right, log scale), out-of-place solid and in-place dashed,
//! one colour per run, and an optional machine limit.

use crate::report::Row;
use std::fmt::Write as _;

const W: f64 = 1130.0;
const H: f64 = 460.0;
const PANEL_W: f64 = 470.0;
const PANEL_H: f64 = 330.0;
const TOP: f64 = 50.0;
const COLORS: [&str; 8] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

fn human_bytes(b: f64) -> String {
    let units = ["B", "K", "M", "G", "T"];
    let mut v = b;
    let mut u = 0;
    while v >= 1024.0 && u < units.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    format!("{}{}", (v * 10.0).round() / 10.0, units[u])
}

struct Panel {
    x0: f64,
    xmin: f64,
    xmax: f64,
    ymin: f64,
    ymax: f64,
    log_y: bool,
}

impl Panel {
    fn x(&self, bytes: f64) -> f64 {
        let (a, b) = (self.xmin.log2(), self.xmax.log2());
        let t = if b > a {
            (bytes.max(1.0).log2() - a) / (b - a)
        } else {
            0.5
        };
        self.x0 + t * PANEL_W
    }
    fn y(&self, v: f64) -> f64 {
        let t = if self.log_y {
            let (a, b) = (self.ymin.log10(), self.ymax.log10());
            if b > a {
                (v.max(self.ymin).log10() - a) / (b - a)
            } else {
                0.5
            }
        } else if self.ymax > self.ymin {
            (v - self.ymin) / (self.ymax - self.ymin)
        } else {
            0.5
        };
        TOP + PANEL_H - t * PANEL_H
    }

    fn axes(&self, s: &mut String, title: &str, ylabel: &str) {
        writeln!(s, r##"<rect x="{}" y="{TOP}" width="{PANEL_W}" height="{PANEL_H}" fill="none" stroke="#444"/>"##, self.x0).unwrap();
        writeln!(
            s,
            r#"<text x="{}" y="{}" font-size="15" text-anchor="middle">{title}</text>"#,
            self.x0 + PANEL_W / 2.0,
            TOP - 12.0
        )
        .unwrap();
        writeln!(
            s,
            r#"<text x="{}" y="{}" font-size="12" text-anchor="middle" transform="rotate(-90 {} {})">{ylabel}</text>"#,
            self.x0 - 45.0,
            TOP + PANEL_H / 2.0,
            self.x0 - 45.0,
            TOP + PANEL_H / 2.0
        )
        .unwrap();
        // x ticks at powers of 4
        let mut b = 1.0f64;
        while b <= self.xmax * 1.0001 {
            if b >= self.xmin / 1.0001 {
                let x = self.x(b);
                writeln!(
                    s,
                    r##"<line x1="{x:.1}" y1="{}" x2="{x:.1}" y2="{}" stroke="#ddd"/>"##,
                    TOP,
                    TOP + PANEL_H
                )
                .unwrap();
                writeln!(
                    s,
                    r#"<text x="{x:.1}" y="{}" font-size="11" text-anchor="middle">{}</text>"#,
                    TOP + PANEL_H + 15.0,
                    human_bytes(b)
                )
                .unwrap();
            }
            b *= 4.0;
        }
        writeln!(s, r#"<text x="{}" y="{}" font-size="12" text-anchor="middle">message size (bytes)</text>"#, self.x0 + PANEL_W / 2.0, TOP + PANEL_H + 34.0).unwrap();
        // y ticks
        let ticks: Vec<f64> = if self.log_y {
            let mut v = Vec::new();
            let mut t = 10f64.powf(self.ymin.log10().floor());
            while t <= self.ymax * 1.0001 {
                if t >= self.ymin / 1.0001 {
                    v.push(t);
                }
                t *= 10.0;
            }
            v
        } else {
            // 1, 2 or 5 times a power of ten, about five ticks.
            let raw = (self.ymax - self.ymin) / 5.0;
            let mag = 10f64.powf(raw.log10().floor());
            let step = [1.0, 2.0, 5.0, 10.0]
                .iter()
                .map(|m| m * mag)
                .find(|s| *s >= raw)
                .unwrap_or(10.0 * mag);
            (0..)
                .map(|i| self.ymin + step * i as f64)
                .take_while(|t| *t <= self.ymax)
                .collect()
        };
        for t in ticks {
            let y = self.y(t);
            writeln!(
                s,
                r##"<line x1="{}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#ddd"/>"##,
                self.x0,
                self.x0 + PANEL_W
            )
            .unwrap();
            writeln!(
                s,
                r#"<text x="{}" y="{:.1}" font-size="11" text-anchor="end">{}</text>"#,
                self.x0 - 5.0,
                y + 4.0,
                crate::report::c_g((t * 100.0).round() / 100.0)
            )
            .unwrap();
        }
    }

    fn line(&self, s: &mut String, pts: &[(f64, f64)], color: &str, dashed: bool) {
        if pts.is_empty() {
            return;
        }
        let d: Vec<String> = pts
            .iter()
            .map(|(x, y)| format!("{:.1},{:.1}", self.x(*x), self.y(*y)))
            .collect();
        let dash = if dashed {
            r#" stroke-dasharray="6 4""#
        } else {
            ""
        };
        writeln!(
            s,
            r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"{dash}/>"#,
            d.join(" ")
        )
        .unwrap();
    }
}

/// Render `rows` (grouped by `Row::series`) as an SVG document.
pub fn svg(title: &str, rows: &[Row], limit_gbs: Option<f64>) -> String {
    let rows: Vec<&Row> = rows.iter().filter(|r| r.bytes > 0).collect();
    let mut series: Vec<&str> = Vec::new();
    for r in &rows {
        if !series.contains(&r.series.as_str()) {
            series.push(&r.series);
        }
    }
    let xmin = rows
        .iter()
        .map(|r| r.bytes as f64)
        .fold(f64::INFINITY, f64::min);
    let xmax = rows.iter().map(|r| r.bytes as f64).fold(0.0, f64::max);
    let bw_max = rows
        .iter()
        .flat_map(|r| [r.oop.busbw, r.ip.busbw])
        .fold(limit_gbs.unwrap_or(0.0), f64::max)
        * 1.1;
    let tmin = rows
        .iter()
        .flat_map(|r| [r.oop.time_us, r.ip.time_us])
        .filter(|t| *t > 0.0)
        .fold(f64::INFINITY, f64::min);
    let tmax = rows
        .iter()
        .flat_map(|r| [r.oop.time_us, r.ip.time_us])
        .fold(0.0, f64::max);
    let (xmin, xmax) = if rows.is_empty() {
        (1.0, 2.0)
    } else {
        (xmin, xmax)
    };
    let bw = Panel {
        x0: 70.0,
        xmin,
        xmax,
        ymin: 0.0,
        ymax: bw_max.max(1e-3),
        log_y: false,
    };
    let tm = Panel {
        x0: 620.0,
        xmin,
        xmax,
        ymin: if tmin.is_finite() {
            10f64.powf(tmin.log10().floor())
        } else {
            1.0
        },
        ymax: if tmax > 0.0 {
            10f64.powf(tmax.log10().ceil())
        } else {
            10.0
        },
        log_y: true,
    };
    let h = H + 16.0 * (series.len().saturating_sub(1) / 4) as f64;
    let mut s = String::new();
    writeln!(s, r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" font-family="sans-serif">"#).unwrap();
    writeln!(s, r#"<rect width="{W}" height="{h}" fill="white"/>"#).unwrap();
    writeln!(s, r#"<text x="{}" y="22" font-size="16" text-anchor="middle" font-weight="bold">{title}</text>"#, W / 2.0).unwrap();
    bw.axes(&mut s, "bus bandwidth", "busbw (GB/s)");
    tm.axes(&mut s, "time per operation", "time (µs, log)");
    if let Some(l) = limit_gbs {
        let y = bw.y(l);
        writeln!(s, r##"<line x1="{}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#d00" stroke-dasharray="3 3" stroke-width="1.5"/>"##, bw.x0, bw.x0 + PANEL_W).unwrap();
        writeln!(s, r##"<text x="{}" y="{:.1}" font-size="11" fill="#d00" text-anchor="end">machine limit {} GB/s</text>"##, bw.x0 + PANEL_W - 4.0, y - 4.0, crate::report::c_g(l)).unwrap();
    }
    for (i, name) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts = |f: &dyn Fn(&Row) -> f64| -> Vec<(f64, f64)> {
            rows.iter()
                .filter(|r| r.series == *name)
                .map(|r| (r.bytes as f64, f(r)))
                .collect()
        };
        bw.line(&mut s, &pts(&|r| r.oop.busbw), color, false);
        bw.line(&mut s, &pts(&|r| r.ip.busbw), color, true);
        tm.line(&mut s, &pts(&|r| r.oop.time_us), color, false);
        tm.line(&mut s, &pts(&|r| r.ip.time_us), color, true);
        let ly = TOP + PANEL_H + 75.0 + 16.0 * (i / 4) as f64;
        let lx = 70.0 + (i % 4) as f64 * 260.0;
        writeln!(
            s,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="2"/>"#,
            lx + 20.0
        )
        .unwrap();
        writeln!(
            s,
            r#"<text x="{}" y="{}" font-size="11">{name}</text>"#,
            lx + 25.0,
            ly + 4.0
        )
        .unwrap();
    }
    writeln!(s, r##"<text x="{}" y="{}" font-size="11" fill="#555">solid: out-of-place, dashed: in-place</text>"##, 620.0, TOP + PANEL_H + 59.0).unwrap();
    s.push_str("</svg>\n");
    s
}
