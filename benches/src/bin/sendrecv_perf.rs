//! `sendrecv_perf`: nccl-tests' `sendrecv_perf` for oxccl (see the `benches` crate docs).
fn main() {
    std::process::exit(benches::main(benches::Coll::SendRecv));
}
