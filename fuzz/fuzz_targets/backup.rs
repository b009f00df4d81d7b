//! A backup's file on arbitrary bytes: see `ticketing::testkit::fuzz::backup`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(failure) = ticketing::testkit::fuzz::backup(data) {
        panic!("{failure}");
    }
});
