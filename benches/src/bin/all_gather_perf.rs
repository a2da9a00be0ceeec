//! `all_gather_perf`: nccl-tests' `all_gather_perf` for oxccl (see the `benches` crate docs).
fn main() {
    std::process::exit(benches::main(benches::Coll::AllGather));
}
