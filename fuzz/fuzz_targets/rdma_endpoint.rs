#![no_main]
// The RDMA endpoint a peer sends during queue-pair setup: decoding must never
// panic, and anything accepted must re-encode to the same bytes.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(e) = transport_rdma::exchange::QpEndpoint::decode(data) {
        assert_eq!(e.encode(), data);
    }
});
