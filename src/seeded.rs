//! Seeded property tests for the crate's own unit tests, as
//! `tests/properties.rs` seeds its own: every run prints its seed, and
//! `TICKETING_QC_SEED` (decimal or `0x` hex) replays it.

use quickcheck::{Gen, QuickCheck};

/// The base seed when `TICKETING_QC_SEED` is not set.
const DEFAULT_SEED: u64 = 0x7469_636b_6574_0001;

fn base_seed() -> u64 {
    match std::env::var("TICKETING_QC_SEED") {
        Ok(text) => {
            let text = text.trim();
            let parsed = match text.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => text.parse(),
            };
            parsed.unwrap_or_else(|e| panic!("TICKETING_QC_SEED={text:?} is not a u64: {e}"))
        }
        Err(_) => DEFAULT_SEED,
    }
}

/// A QuickCheck of `cases` cases for `property`, its generator seeded
/// from the base seed and the property's name (so that two properties
/// draw apart), the seed printed.
pub(crate) fn qc(property: &str, cases: u64) -> QuickCheck {
    let base = base_seed();
    let mut seed = base;
    for b in property.bytes() {
        seed = (seed ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    println!("{property}: TICKETING_QC_SEED={base} (generator seed {seed:#x}), {cases} cases");
    QuickCheck::new()
        .rng(Gen::from_size_and_seed(40, seed))
        .tests(cases)
        .max_tests(cases)
}
