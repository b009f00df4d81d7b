//! A replicated cluster's entries of decisions on arbitrary bytes: see
//! `ticketing::testkit::fuzz::decisions`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(failure) = ticketing::testkit::fuzz::decisions(data) {
        panic!("{failure}");
    }
});
