//! `alltoall_perf`: nccl-tests' `alltoall_perf` for oxccl (see the `benches` crate docs).
fn main() {
    std::process::exit(benches::main(benches::Coll::AllToAll));
}
