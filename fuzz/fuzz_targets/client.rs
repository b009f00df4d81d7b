//! A client core against the model server, driven by arbitrary steps, with
//! the invariant checker after every step: see
//! `ticketing::testkit::fuzz::client`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(violation) = ticketing::testkit::fuzz::client(data) {
        panic!("{violation}");
    }
});
