//! Loss curves as SVG: one line per run (a `--metrics` CSV each).

use std::fmt::Write as _;

/// Read `step,loss,...` rows of a metrics CSV.
pub fn read_metrics(path: &str) -> std::io::Result<Vec<(f64, f64)>> {
    let text = std::fs::read_to_string(path)?;
    Ok(text
        .lines()
        .skip(1)
        .filter_map(|l| {
            let mut f = l.split(',');
            Some((f.next()?.parse().ok()?, f.next()?.parse().ok()?))
        })
        .collect())
}

/// Render runs (label, points) as an SVG document.
pub fn svg(title: &str, runs: &[(String, Vec<(f64, f64)>)]) -> String {
    const W: f64 = 760.0;
    const H: f64 = 420.0;
    const L: f64 = 70.0;
    const T: f64 = 40.0;
    const PW: f64 = 560.0;
    const PH: f64 = 320.0;
    const COLORS: [&str; 6] = [
        "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
    ];
    let pts = runs.iter().flat_map(|(_, p)| p.iter());
    let xmax = pts.clone().map(|p| p.0).fold(1.0, f64::max);
    let ymax = pts.clone().map(|p| p.1).fold(0.0, f64::max).max(1e-9);
    let ymin = pts.map(|p| p.1).fold(f64::INFINITY, f64::min).min(ymax);
    let x = |v: f64| L + v / xmax * PW;
    let y = |v: f64| T + PH - (v - ymin) / (ymax - ymin).max(1e-9) * PH;
    let mut s = String::new();
    writeln!(s, r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif">"#).unwrap();
    writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#).unwrap();
    writeln!(s, r#"<text x="{}" y="24" font-size="15" text-anchor="middle" font-weight="bold">{title}</text>"#, L + PW / 2.0).unwrap();
    writeln!(
        s,
        r##"<rect x="{L}" y="{T}" width="{PW}" height="{PH}" fill="none" stroke="#444"/>"##
    )
    .unwrap();
    for i in 0..=5 {
        let v = ymin + (ymax - ymin) * i as f64 / 5.0;
        writeln!(
            s,
            r##"<text x="{}" y="{:.1}" font-size="11" text-anchor="end">{v:.2}</text>"##,
            L - 5.0,
            y(v) + 4.0
        )
        .unwrap();
        let sv = xmax * i as f64 / 5.0;
        writeln!(
            s,
            r##"<text x="{:.1}" y="{}" font-size="11" text-anchor="middle">{sv:.0}</text>"##,
            x(sv),
            T + PH + 15.0
        )
        .unwrap();
    }
    writeln!(
        s,
        r#"<text x="{}" y="{}" font-size="12" text-anchor="middle">step</text>"#,
        L + PW / 2.0,
        T + PH + 34.0
    )
    .unwrap();
    writeln!(s, r#"<text x="18" y="{}" font-size="12" transform="rotate(-90 18 {})" text-anchor="middle">training loss</text>"#, T + PH / 2.0, T + PH / 2.0).unwrap();
    for (i, (label, p)) in runs.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let d: Vec<String> = p
            .iter()
            .map(|(a, b)| format!("{:.1},{:.1}", x(*a), y(*b)))
            .collect();
        // Later runs dashed so identical curves stay visible on top of each other.
        let dash = if i > 0 {
            format!(r#" stroke-dasharray="{} 4""#, 2 + 3 * i)
        } else {
            String::new()
        };
        writeln!(
            s,
            r#"<polyline points="{}" fill="none" stroke="{c}" stroke-width="1.5"{dash}/>"#,
            d.join(" ")
        )
        .unwrap();
        writeln!(
            s,
            r#"<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="{c}" stroke-width="2"{dash}/>"#,
            L + PW + 15.0,
            T + 20.0 * i as f64 + 10.0,
            L + PW + 40.0,
            T + 20.0 * i as f64 + 10.0
        )
        .unwrap();
        writeln!(
            s,
            r#"<text x="{}" y="{}" font-size="12">{label}</text>"#,
            L + PW + 45.0,
            T + 20.0 * i as f64 + 14.0
        )
        .unwrap();
    }
    s.push_str("</svg>\n");
    s
}
