//! The credential a server requires (PROTOCOL.md section 4, rule 8),
//! compared in a time that depends on neither credential.
//!
//! A comparison that stops at the first difference, or at a difference of
//! length, tells a client that can time it how much of its guess was
//! right, or how long the credential is. So both sides are laid out as a
//! block of the same size, whatever their lengths: the length in the
//! first byte, then the bytes, zero-padded to the longest atom
//! ([`MAX_ATOM`], 250 bytes). Every byte of both blocks is compared, the
//! differences folded together, and only the fold is looked at.
//!
//! The required credential's block is made once, when the server is;
//! the offered one's when its `H` arrives (that copy takes a time that
//! depends on the offered length, which the client chose). Rust promises
//! nothing about timing: [`black_box`] keeps the optimiser from reasoning
//! about the blocks and the fold, which is what the `subtle` crate does
//! too, without taking a dependency into the core for twenty lines.

use core::hint::black_box;

use crate::names::Name;
use crate::wire::MAX_ATOM;

/// A credential as the comparison reads it: its length, then its bytes,
/// zero-padded.
type Block = [u8; MAX_ATOM + 1];

/// The credential clients must present.
#[derive(Clone)]
pub(crate) struct Credential {
    block: Block,
}

impl Credential {
    pub(crate) fn new(required: &Name) -> Credential {
        Credential {
            block: block(required.as_bytes()),
        }
    }

    /// Whether `offered` is the credential, in a time that depends on
    /// neither.
    pub(crate) fn admits(&self, offered: &[u8]) -> bool {
        same(&self.block, &block(offered))
    }
}

/// `bytes` as a block. An atom is at most [`MAX_ATOM`] bytes; anything
/// longer gets a length no credential has, so it is never admitted.
fn block(bytes: &[u8]) -> Block {
    let mut block = [0; MAX_ATOM + 1];
    let len = bytes.len().min(MAX_ATOM);
    block[0] = u8::try_from(bytes.len()).unwrap_or(u8::MAX);
    block[1..=len].copy_from_slice(&bytes[..len]);
    block
}

/// Whether two blocks are equal, having compared every byte of both.
fn same(a: &Block, b: &Block) -> bool {
    let (a, b) = (black_box(a), black_box(b));
    let mut diff = 0u8;
    for (x, y) in a.iter().zip(b) {
        diff |= x ^ y;
        #[cfg(test)]
        tests::COMPARED.with(|n| n.set(n.get() + 1));
    }
    black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    thread_local! {
        /// Byte positions compared on this thread.
        pub(super) static COMPARED: Cell<usize> = const { Cell::new(0) };
    }

    /// Whether `required` admits `offered`, and how many byte positions
    /// that compared.
    fn admits(required: &str, offered: &str) -> (bool, usize) {
        let credential = Credential::new(&Name::new(required).expect("an atom"));
        COMPARED.with(|n| n.set(0));
        let admitted = credential.admits(offered.as_bytes());
        (admitted, COMPARED.with(Cell::get))
    }

    #[test]
    fn a_credential_is_compared_whole_whatever_either_length() {
        let long = "k".repeat(MAX_ATOM);
        let nearly = format!("{}j", "k".repeat(MAX_ATOM - 1));
        let cases: [(&str, &str, bool); 9] = [
            ("secret", "secret", true),
            ("secret", "secreT", false),
            ("secret", "Secret", false),
            ("secret", "secret2", false),
            ("secret", "secre", false),
            ("secret", "s", false),
            ("s", "secret", false),
            (&long, &long, true),
            (&long, &nearly, false),
        ];
        for (required, offered, want) in cases {
            let (admitted, compared) = admits(required, offered);
            assert_eq!(admitted, want, "{required:?} against {offered:?}");
            assert_eq!(
                compared,
                MAX_ATOM + 1,
                "{required:?} ({} bytes) against {offered:?} ({} bytes): {compared} positions compared",
                required.len(),
                offered.len()
            );
        }
    }

    #[test]
    fn the_length_is_part_of_what_is_compared() {
        // Zero padding alone would make a credential equal to itself
        // followed by zero bytes; the length byte tells them apart.
        let credential = Credential::new(&Name::new("ab").expect("an atom"));
        assert!(!credential.admits(b"ab\0"));
        assert!(!credential.admits(b"ab\0\0\0"));
        assert!(credential.admits(b"ab"));
        // Longer than any atom: never admitted, and no panic.
        let huge = "k".repeat(MAX_ATOM + 10);
        let long = Credential::new(&Name::new("k".repeat(MAX_ATOM)).expect("an atom"));
        assert!(!long.admits(huge.as_bytes()));
        assert!(!long.admits(b""));
    }
}
