//! `oxccl-trace why DIR`: read every rank's flight dump in DIR and say
//! what happened (see the library's `why`).

use std::path::Path;

const USAGE: &str = "usage: oxccl-trace why DIR   (DIR: the job's OXCCL_FLIGHT_DIR)";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["why", dir] => match oxccl_trace::flight::load(Path::new(dir)) {
            Ok(dumps) => {
                for f in oxccl_trace::why::why(&dumps) {
                    println!("{}", f.text);
                }
                0
            }
            Err(e) => {
                eprintln!("oxccl-trace: {e}");
                1
            }
        },
        ["-h" | "--help"] => {
            println!("{USAGE}");
            0
        }
        _ => {
            eprintln!("{USAGE}");
            2
        }
    };
    std::process::exit(code);
}
