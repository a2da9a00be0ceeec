//! `oxccl-trace`: see the library's docs.
//!
//!   oxccl-trace why DIR              what happened (flight dumps in DIR)
//!   oxccl-trace merge DIR -o FILE    every rank's trace in DIR, on rank 0's
//!                                    clock, in one file for Perfetto
//!   oxccl-trace check FILE           the trace-event format's rules, and
//!                                    slices per rank and category

use std::path::Path;

const USAGE: &str = "usage: oxccl-trace why DIR | merge DIR -o FILE | check FILE";

fn run(args: &[&str]) -> Result<(), String> {
    match args {
        ["why", dir] => {
            let dumps = oxccl_trace::flight::load(Path::new(dir))?;
            for f in oxccl_trace::why::why(&dumps) {
                println!("{}", f.text);
            }
            Ok(())
        }
        ["merge", dir, "-o", out] => {
            let traces = oxccl_trace::merge::load(Path::new(dir))?;
            let merged = oxccl_trace::merge::merge(&traces);
            let counts = oxccl_trace::merge::check(&merged)?;
            std::fs::write(out, merged.to_string())
                .map_err(|e| format!("cannot write {out}: {e}"))?;
            let slices: usize = counts.slices.values().sum();
            println!(
                "{out}: {} ranks, {slices} slices (open it in ui.perfetto.dev)",
                traces.len()
            );
            Ok(())
        }
        ["check", file] => {
            let text =
                std::fs::read_to_string(file).map_err(|e| format!("cannot read {file}: {e}"))?;
            let v: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| format!("{file}: not JSON: {e}"))?;
            let c = oxccl_trace::merge::check(&v).map_err(|e| format!("{file}: {e}"))?;
            for ((pid, cat), n) in &c.slices {
                println!("pid {pid} {cat} {n}");
            }
            Ok(())
        }
        ["-h" | "--help"] => {
            println!("{USAGE}");
            Ok(())
        }
        _ => Err(USAGE.to_string()),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    if let Err(e) = run(&args) {
        eprintln!("oxccl-trace: {e}");
        std::process::exit(if e == USAGE { 2 } else { 1 });
    }
}
