//! Owned, validated, cheaply cloned atoms: keys, names and endpoints.
//!
//! Each is a reference-counted string checked once when it is made. Cloning
//! one is a reference-count increment, so an embedder that makes its keys
//! once and clones them into every acquire costs the core no allocation.

use core::fmt;
use std::sync::Arc;

use crate::wire::{self, AtomError};

macro_rules! atom_type {
    ($(#[$doc:meta])* $name:ident, $check:expr, $wire:ident) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Arc<str>);

        impl $name {
            /// Checks `s` and makes an owned copy of it.
            pub fn new(s: impl AsRef<str>) -> Result<$name, AtomError> {
                let s = s.as_ref();
                let check: fn(&str) -> Result<(), AtomError> = $check;
                check(s)?;
                Ok($name(Arc::from(s)))
            }

            /// The text.
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// The text's bytes.
            pub fn as_bytes(&self) -> &[u8] {
                self.0.as_bytes()
            }

            /// The value as it goes on the wire.
            pub fn to_wire(&self) -> wire::$wire<'_> {
                // Checked when it was made.
                wire::$wire::trusted(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&*self.0, f)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl core::str::FromStr for $name {
            type Err = AtomError;
            fn from_str(s: &str) -> Result<$name, AtomError> {
                $name::new(s)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl<'a> From<wire::$wire<'a>> for $name {
            fn from(value: wire::$wire<'a>) -> $name {
                $name(Arc::from(value.as_str()))
            }
        }
    };
}

fn check_atom(s: &str) -> Result<(), AtomError> {
    wire::check_atom(s.as_bytes())
}

fn check_addr(s: &str) -> Result<(), AtomError> {
    wire::check_atom(s.as_bytes())?;
    // `http://127.0.0.1:7878` is `host:port` to the letter, with a host
    // no connector can reach: a URL is not an address.
    if wire::is_host_port(s.as_bytes()) && !s.contains("://") {
        Ok(())
    } else {
        Err(AtomError::NotAnAddress)
    }
}

atom_type!(
    /// The name of a lock: an atom, 1 to 250 bytes, each printable ASCII
    /// other than the space (`0x21..=0x7E`: letters, digits and
    /// punctuation such as `-_.:/@#`). Anything else is refused with an
    /// [`AtomError`] that says which byte, or how long it was: a space, a
    /// tab or a newline, a byte above `0x7E` (so no UTF-8 beyond ASCII),
    /// an empty key, a key of 251 bytes or more.
    ///
    /// Keys are compared byte for byte. To lock on a name that may hold
    /// other characters, or be longer, map it to a key first: its
    /// percent-encoding, or a hash of it in hex.
    ///
    /// ```
    /// use ticketing::Key;
    /// use ticketing::wire::AtomError;
    ///
    /// assert!(Key::new("invoices/2026-12:eu-west").is_ok());
    /// assert_eq!(Key::new("two words"), Err(AtomError::InvalidByte { at: 3, byte: b' ' }));
    /// assert_eq!(Key::new("é").unwrap_err(), AtomError::InvalidByte { at: 0, byte: 0xc3 });
    /// assert_eq!(Key::new("k".repeat(251)), Err(AtomError::TooLong { len: 251 }));
    /// assert_eq!(Key::new(""), Err(AtomError::Empty));
    /// ```
    Key,
    check_atom,
    Atom
);

atom_type!(
    /// Any other atom: an owner, a client id, a credential, a node id, an
    /// error reason.
    Name,
    check_atom,
    Atom
);

atom_type!(
    /// A server address, `host:port` (`10.0.0.1:7878`, `locks.internal:7878`,
    /// `[::1]:7878`): an endpoint of the configuration, an allowlisted
    /// address, or a leader hint. Not a URL: `http://127.0.0.1:7878` is
    /// refused ([`AtomError::NotAnAddress`]). The core never resolves it;
    /// the driver's connector does (a host that does not resolve ends the
    /// connect attempt with an error that says so).
    Endpoint,
    check_addr,
    Addr
);

impl Key {
    /// Whether the key is `bytes`, without allocating.
    #[inline]
    pub(crate) fn is(&self, bytes: &[u8]) -> bool {
        let mine = self.0.as_bytes();
        let n = mine.len();
        if n != bytes.len() {
            return false;
        }
        // Short keys, the usual ones, as two words that overlap, without a
        // call.
        let word = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8"));
        if (8..=16).contains(&n) {
            word(mine, 0) == word(bytes, 0) && word(mine, n - 8) == word(bytes, n - 8)
        } else {
            mine == bytes
        }
    }
}

impl Endpoint {
    /// Whether the endpoint is `addr`, without allocating.
    pub(crate) fn is(&self, addr: wire::Addr<'_>) -> bool {
        self.0.as_bytes() == addr.as_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owned_atoms_are_validated_once_and_cheap_to_clone() {
        let key = Key::new("printer").unwrap();
        let clone = key.clone();
        assert!(Arc::ptr_eq(&key.0, &clone.0));
        assert_eq!(key.to_wire().as_str(), "printer");
        assert_eq!(
            Key::new("two words"),
            Err(AtomError::InvalidByte { at: 3, byte: b' ' })
        );
        assert_eq!(Endpoint::new("localhost"), Err(AtomError::NotAnAddress));
        for url in ["http://127.0.0.1:7878", "tcp://locks.internal:7878"] {
            assert_eq!(Endpoint::new(url), Err(AtomError::NotAnAddress), "{url}");
        }
        assert_eq!(
            "127.0.0.1:7878".parse::<Endpoint>().unwrap().as_str(),
            "127.0.0.1:7878"
        );
    }
}
