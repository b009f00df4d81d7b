//! Arbitrary frames from authenticated peers into the members of a
//! replicated cluster: see `ticketing::testkit::peer_frames`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(failure) = ticketing::testkit::peer_frames::peer_frames(data) {
        panic!("{failure}");
    }
});
