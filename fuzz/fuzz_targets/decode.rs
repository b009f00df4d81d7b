//! The codec on arbitrary bytes in arbitrary chunks: see
//! `ticketing::testkit::fuzz::decode`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(failure) = ticketing::testkit::fuzz::decode(data) {
        panic!("{failure}");
    }
});
