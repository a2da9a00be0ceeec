//! `reduce_perf`: nccl-tests' `reduce_perf` for oxccl (see the `benches` crate docs).
fn main() {
    std::process::exit(benches::main(benches::Coll::Reduce));
}
