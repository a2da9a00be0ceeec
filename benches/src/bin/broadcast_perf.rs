//! `broadcast_perf`: nccl-tests' `broadcast_perf` for oxccl (see the `benches` crate docs).
fn main() {
    std::process::exit(benches::main(benches::Coll::Broadcast));
}
