#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| comm_core::fuzz::message_header(data));
