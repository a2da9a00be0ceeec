//! `all_reduce_perf`: nccl-tests' `all_reduce_perf` for oxccl (see the `benches` crate docs).
fn main() {
    std::process::exit(benches::main(benches::Coll::AllReduce));
}
