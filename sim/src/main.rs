//! `oxccl-sim`: predicted time and bus bandwidth of oxccl's collectives on
//! a modelled cluster, per size and algorithm, in nccl-tests' format.

use algorithms::{Algorithm, CollSpec, Kind, Tuning, REGISTRY};
use oxccl_sim::{model, predict, Call, How, Model, Topology};
use std::process::ExitCode;
use std::time::Instant;

const USAGE: &str = "\
usage: oxccl-sim [--hosts H] [--per-host P] [-c COLL] [-a ALGOS] [-b MIN] [-e MAX] [-f FACTOR]
                 [--elem BYTES] [--chunk BYTES] [--root R] [--profile FILE] [--set KEY=VALUE]...
                 [--full] [--print-profile]

  --hosts H, --per-host P  the job: H hosts of P ranks (rank r on host r / P); default 1 x 8
  -c COLL                  all_reduce (default), all_gather, reduce_scatter, broadcast, reduce, all_to_all
  -a ALGOS                 algorithm names separated by commas, `all` (default: every one that
                           runs the call) or `auto` (the one the runtime picks today)
  -b, -e, -f               sizes from MIN to MAX bytes, times FACTOR (default 8, 256M, 2)
  --elem BYTES             bytes per element (default 4, float)
  --chunk BYTES            bytes per pipelined chunk, OXCCL_BUFFSIZE (default 1M)
  --profile FILE           a cost model: `key = value` lines (see --print-profile)
  --set KEY=VALUE          one setting of the model, after the profile
  --full                   simulate every rank even when one host's ranks stand for all
  --print-profile          print the model in profile form and exit

Settings of the model:";

fn main() -> ExitCode {
    match run(std::env::args().skip(1).collect()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("oxccl-sim: {e}");
            ExitCode::from(2)
        }
    }
}

fn usage() -> String {
    let mut s = USAGE.to_string();
    for (k, kind, what) in model::FIELDS {
        s.push_str(&format!("\n  {k:<14} {kind:<6} {what}"));
    }
    s
}

/// `8`, `64K`, `256M`, `1G` (powers of two).
fn parse_size(s: &str) -> Result<usize, String> {
    let (num, shift) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    num.parse::<usize>()
        .ok()
        .and_then(|v| v.checked_mul(1 << shift))
        .ok_or_else(|| format!("{s:?} is not a size (e.g. 8, 64K, 256M, 1G)"))
}

fn parse_kind(s: &str) -> Result<Kind, String> {
    Kind::COLLECTIVES
        .into_iter()
        .filter(|k| *k != Kind::Barrier)
        .find(|k| k.name() == s || k.name().replace('_', "") == s)
        .ok_or_else(|| format!("{s:?} is not a collective (all_reduce, all_gather, reduce_scatter, broadcast, reduce, all_to_all)"))
}

struct Args {
    topo: Topology,
    kind: Kind,
    algos: String,
    sizes: (usize, usize, usize),
    elem: usize,
    chunk: usize,
    root: usize,
    model: Model,
    full: bool,
    print_profile: bool,
}

fn parse(args: Vec<String>) -> Result<Args, String> {
    let (mut hosts, mut per_host) = (1usize, 8usize);
    let mut a = Args {
        topo: Topology::new(1, 1)?,
        kind: Kind::AllReduce,
        algos: "all".into(),
        sizes: (8, 256 << 20, 2),
        elem: 4,
        chunk: 1 << 20,
        root: 0,
        model: Model::default(),
        full: false,
        print_profile: false,
    };
    let mut sets = Vec::new();
    let mut it = args.into_iter();
    while let Some(flag) = it.next() {
        let mut val = || {
            it.next()
                .ok_or_else(|| format!("{flag} needs a value\n{}", usage()))
        };
        let count = |v: String, what: &str| {
            v.parse::<usize>()
                .map_err(|_| format!("{what} {v:?} is not a count"))
        };
        match flag.as_str() {
            "--hosts" => hosts = count(val()?, "--hosts")?,
            "--per-host" => per_host = count(val()?, "--per-host")?,
            "-c" | "--coll" => a.kind = parse_kind(&val()?)?,
            "-a" | "--algo" => a.algos = val()?,
            "-b" => a.sizes.0 = parse_size(&val()?)?,
            "-e" => a.sizes.1 = parse_size(&val()?)?,
            "-f" => a.sizes.2 = count(val()?, "-f")?,
            "--elem" => a.elem = count(val()?, "--elem")?,
            "--chunk" => a.chunk = parse_size(&val()?)?,
            "--root" => a.root = count(val()?, "--root")?,
            "--profile" => {
                let f = val()?;
                let text =
                    std::fs::read_to_string(&f).map_err(|e| format!("--profile {f}: {e}"))?;
                a.model
                    .load(&text)
                    .map_err(|e| format!("--profile {f}: {e}"))?;
            }
            "--set" => sets.push(val()?),
            "--full" => a.full = true,
            "--print-profile" => a.print_profile = true,
            "-h" | "--help" => return Err(usage()),
            other => return Err(format!("unknown flag {other:?}\n{}", usage())),
        }
    }
    for s in sets {
        let (k, v) = s
            .split_once('=')
            .ok_or_else(|| format!("--set {s:?} is not KEY=VALUE"))?;
        a.model
            .set(k.trim(), v.trim())
            .map_err(|e| format!("--set: {e}"))?;
    }
    a.topo = Topology::new(hosts, per_host)?;
    let n = a.topo.nranks();
    if ![1, 2, 4, 8].contains(&a.elem) {
        return Err(format!("--elem {} is not 1, 2, 4 or 8 bytes", a.elem));
    }
    if a.sizes.0 == 0 || a.sizes.0 > a.sizes.1 || a.sizes.2 < 2 {
        return Err(format!(
            "sizes from {} to {} by {} make no sweep (0 < MIN <= MAX, FACTOR >= 2)",
            a.sizes.0, a.sizes.1, a.sizes.2
        ));
    }
    if a.chunk < a.elem {
        return Err(format!("--chunk {} is less than one element", a.chunk));
    }
    if a.root >= n {
        return Err(format!("--root {} is not a rank of {n}", a.root));
    }
    Ok(a)
}

/// An algorithm to simulate: its label and the algorithm (`None`: `auto`,
/// the runtime's own choice per size).
type Entry = (String, Option<&'static dyn Algorithm>);

/// The algorithms to simulate.
fn algorithms(spec_list: &str) -> Result<Vec<Entry>, String> {
    let mut out = Vec::new();
    for name in spec_list.split(',').map(str::trim) {
        match name {
            "all" => out.extend(REGISTRY.iter().map(|a| (a.name().to_string(), Some(*a)))),
            "auto" => out.push(("auto".to_string(), None)),
            _ => match algorithms::find(name) {
                Some(a) => out.push((name.to_string(), Some(a))),
                None => {
                    return Err(format!(
                        "{name:?} is not an algorithm (known: {}, all, auto)",
                        algorithms::names()
                    ))
                }
            },
        }
    }
    Ok(out)
}

fn run(args: Vec<String>) -> Result<(), String> {
    let a = parse(args)?;
    if a.print_profile {
        print!("{}", a.model.to_profile());
        return Ok(());
    }
    let n = a.topo.nranks();
    let mut sizes = Vec::new();
    let mut s = a.sizes.0;
    while s <= a.sizes.1 {
        sizes.push(s);
        s = match s.checked_mul(a.sizes.2) {
            Some(v) => v,
            None => break,
        };
    }
    let probe = Call {
        kind: a.kind,
        bytes: a.sizes.1,
        elem: a.elem,
        chunk_bytes: a.chunk,
        root: a.root,
    };
    // Ranks placed as the topology says (hierarchical algorithms use it).
    let placed = |spec: CollSpec| CollSpec {
        layout: a.topo.layout(),
        ..spec
    };
    let algos: Vec<_> = algorithms(&a.algos)?
        .into_iter()
        .filter(|(_, alg)| alg.is_none_or(|alg| alg.supports(&placed(probe.spec(0, n)))))
        .collect();
    if algos.is_empty() {
        return Err(format!(
            "no algorithm of {:?} runs {} on {n} ranks",
            a.algos,
            a.kind.name()
        ));
    }
    println!(
        "# oxccl-sim: {} hosts x {} ranks = {n} ranks, {}, {}-byte elements, chunk {} B",
        a.topo.hosts,
        a.topo.per_host,
        a.kind.name(),
        a.elem,
        a.chunk
    );
    for line in a.model.to_profile().lines() {
        println!("#   {line}");
    }
    // best[size index] = (time, name)
    let mut best: Vec<Option<(f64, String)>> = vec![None; sizes.len()];
    for (label, alg) in &algos {
        println!("#\n# Algorithm: {label}");
        println!(
            "# {:>10} {:>12} {:>8} {:>6} {:>6} {:>10} {:>8} {:>8}  simulated",
            "size", "count", "type", "redop", "root", "time", "algbw", "busbw"
        );
        println!(
            "# {:>10} {:>12} {:>8} {:>6} {:>6} {:>10} {:>8} {:>8}",
            "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)"
        );
        for (i, &bytes) in sizes.iter().enumerate() {
            let call = Call {
                kind: a.kind,
                bytes,
                elem: a.elem,
                chunk_bytes: a.chunk,
                root: a.root,
            };
            let spec = placed(call.spec(0, n));
            let chosen = match alg {
                Some(x) => *x,
                None => match algorithms::choose(&spec, None, &Tuning::default()) {
                    Some(x) => x,
                    None => continue,
                },
            };
            let t0 = Instant::now();
            let (out, how) = match predict(&a.model, &a.topo, chosen, &spec, a.full) {
                Ok(v) => v,
                Err(e) => {
                    println!("  {bytes:>10}  not simulated: {e}");
                    continue;
                }
            };
            let shown = call.shown_bytes(n);
            let algbw = shown as f64 / out.time / 1e9;
            let busbw = algbw * call.bus_factor(n);
            let how = match how {
                How::Full => format!("all {n} ranks"),
                How::Periodic(s, f) => format!("{} of {n} ranks ({s:?}, {f:?})", a.topo.per_host),
            };
            let note = if alg.is_none() {
                format!(" [{}]", chosen.name())
            } else {
                String::new()
            };
            let root = if matches!(a.kind, Kind::Broadcast | Kind::Reduce) {
                a.root as i64
            } else {
                -1
            };
            let redop = if matches!(a.kind, Kind::AllReduce | Kind::ReduceScatter | Kind::Reduce) {
                "sum"
            } else {
                "none"
            };
            println!(
                "  {shown:>10} {:>12} {:>8} {redop:>6} {root:>6} {:>10.2} {algbw:>8.2} {busbw:>8.2}  {how}, {} steps, {:.2} s{note}",
                shown / a.elem,
                match a.elem { 1 => "int8", 2 => "half", 8 => "double", _ => "float" },
                out.time * 1e6,
                out.steps,
                t0.elapsed().as_secs_f64()
            );
            if alg.is_some() && best[i].as_ref().is_none_or(|b| out.time < b.0) {
                best[i] = Some((out.time, label.clone()));
            }
        }
    }
    if algos.iter().filter(|x| x.1.is_some()).count() > 1 {
        println!("#\n# Fastest per size");
        for (i, b) in best.iter().enumerate() {
            if let Some((t, name)) = b {
                println!("  {:>10} {:>10.2} us  {name}", sizes[i], t * 1e6);
            }
        }
    }
    Ok(())
}
