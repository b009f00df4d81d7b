//! Owned, validated, cheaply cloned atoms: keys, names and endpoints.
//!
//! Each is a reference-counted string checked once when it is made. Cloning
//! one is a reference-count increment, so an embedder that makes its keys
//! once and clones them into every acquire costs the core no allocation.

use core::fmt;
use std::sync::Arc;

use thiserror::Error;

use crate::wire::{self, AtomError};

/// What kind of value an [`InvalidValue`] was to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ValueKind {
    /// A [`Key`].
    Key,
    /// A [`Name`]: an owner, a client or node id, a credential.
    Name,
    /// An [`Endpoint`].
    Address,
}

/// Why text is not a [`Key`], a [`Name`] or an [`Endpoint`], for a person
/// to read: what it was to be, the value (but for a name, which may be a
/// credential), what is wrong with it and the rule, e.g. `invalid key "my
/// invoices": a space (0x20) at offset 2; a key is 1 to 250 printable
/// ASCII bytes, no space`.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("invalid {}{}: {why}; {}", kind_word(self.kind), quoted(self.value.as_deref()), rule(self.kind, self.why))]
pub struct InvalidValue {
    kind: ValueKind,
    /// The value, shortened; `None` for a name.
    value: Option<String>,
    why: AtomError,
}

impl InvalidValue {
    fn new(kind: ValueKind, value: &str, why: AtomError) -> InvalidValue {
        // Long enough to recognise, short enough for a log line.
        const SHOWN: usize = 64;
        let value = (kind != ValueKind::Name).then(|| {
            let mut shown: String = value.chars().take(SHOWN).collect();
            if value.chars().count() > SHOWN {
                shown.push('…');
            }
            shown
        });
        InvalidValue { kind, value, why }
    }

    /// What the value was to be.
    pub fn kind(&self) -> ValueKind {
        self.kind
    }

    /// What is wrong with it, as the wire's rules say.
    pub fn reason(&self) -> AtomError {
        self.why
    }
}

fn kind_word(kind: ValueKind) -> &'static str {
    match kind {
        ValueKind::Key => "key",
        ValueKind::Name => "name",
        ValueKind::Address => "address",
    }
}

/// ` "value"`, escaped as Rust writes a string, or nothing.
fn quoted(value: Option<&str>) -> String {
    value.map_or_else(String::new, |v| format!(" {v:?}"))
}

fn rule(kind: ValueKind, why: AtomError) -> &'static str {
    match (kind, why) {
        (ValueKind::Address, AtomError::NotAnAddress) => {
            "an address is host:port (10.0.0.1:7878, [::1]:7878, locks.internal:7878), not a URL"
        }
        (ValueKind::Address, _) => {
            "an address is host:port, 1 to 250 printable ASCII bytes, no space"
        }
        (ValueKind::Key, _) => "a key is 1 to 250 printable ASCII bytes, no space (0x21..=0x7e)",
        _ => "a name is 1 to 250 printable ASCII bytes, no space (0x21..=0x7e)",
    }
}

macro_rules! atom_type {
    ($(#[$doc:meta])* $name:ident, $kind:ident, $check:expr, $wire:ident) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Arc<str>);

        impl $name {
            /// Checks `s` and makes an owned copy of it.
            pub fn new(s: impl AsRef<str>) -> Result<$name, InvalidValue> {
                let s = s.as_ref();
                let check: fn(&str) -> Result<(), AtomError> = $check;
                check(s).map_err(|why| InvalidValue::new(ValueKind::$kind, s, why))?;
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
            type Err = InvalidValue;
            fn from_str(s: &str) -> Result<$name, InvalidValue> {
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
    /// [`InvalidValue`] that names the key and says which byte, or how long
    /// it was ([`InvalidValue::reason`]): a space, a tab or a newline, a
    /// byte above `0x7E` (so no UTF-8 beyond ASCII), an empty key, a key of
    /// 251 bytes or more.
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
    /// let err = Key::new("my invoices").unwrap_err();
    /// assert_eq!(err.reason(), AtomError::InvalidByte { at: 2, byte: b' ' });
    /// assert_eq!(
    ///     err.to_string(),
    ///     "invalid key \"my invoices\": a space (0x20) at offset 2; \
    ///      a key is 1 to 250 printable ASCII bytes, no space (0x21..=0x7e)"
    /// );
    /// assert_eq!(Key::new("é").unwrap_err().reason(), AtomError::InvalidByte { at: 0, byte: 0xc3 });
    /// assert_eq!(Key::new("k".repeat(251)).unwrap_err().reason(), AtomError::TooLong { len: 251 });
    /// assert_eq!(Key::new("").unwrap_err().reason(), AtomError::Empty);
    /// ```
    Key,
    Key,
    check_atom,
    Atom
);

atom_type!(
    /// Any other atom: an owner, a client id, a credential, a node id, an
    /// error reason. Its errors never show the value (it may be a
    /// credential).
    Name,
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
    Address,
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
            Key::new("two words").unwrap_err().reason(),
            AtomError::InvalidByte { at: 3, byte: b' ' }
        );
        assert_eq!(
            Endpoint::new("localhost").unwrap_err().reason(),
            AtomError::NotAnAddress
        );
        for url in ["http://127.0.0.1:7878", "tcp://locks.internal:7878"] {
            let err = Endpoint::new(url).unwrap_err();
            assert_eq!(err.reason(), AtomError::NotAnAddress, "{url}");
            assert_eq!(err.kind(), ValueKind::Address);
        }
        assert_eq!(
            "127.0.0.1:7878".parse::<Endpoint>().unwrap().as_str(),
            "127.0.0.1:7878"
        );
    }

    /// Issue 32: errors a person reads, naming what the value was to be,
    /// the value (never a name's: it may be a credential), what is wrong
    /// and the rule.
    #[test]
    fn an_invalid_value_says_what_it_was_to_be_what_is_wrong_and_the_rule() {
        let key_rule = "a key is 1 to 250 printable ASCII bytes, no space (0x21..=0x7e)";
        for (bad, why) in [
            ("my invoices", "a space (0x20) at offset 2"),
            ("tab\there", "a tab (0x09) at offset 3"),
            ("line\n", "a line break (0x0a) at offset 4"),
            ("nul\0", "a control byte (0x00) at offset 3"),
            ("café", "a byte beyond ASCII (0xc3) at offset 3"),
            ("", "empty"),
        ] {
            assert_eq!(
                Key::new(bad).unwrap_err().to_string(),
                format!("invalid key {bad:?}: {why}; {key_rule}")
            );
        }
        let long = "k".repeat(300);
        let text = Key::new(&long).unwrap_err().to_string();
        assert!(
            text.starts_with(&format!(
                "invalid key \"{}…\": 300 bytes, more than 250;",
                "k".repeat(64)
            )),
            "{text}"
        );
        let secret = "s3cret with a space";
        let text = Name::new(secret).unwrap_err().to_string();
        assert_eq!(
            text,
            "invalid name: a space (0x20) at offset 6; a name is 1 to 250 printable ASCII bytes, no space (0x21..=0x7e)"
        );
        assert!(!text.contains("s3cret"));
        assert_eq!(
            Endpoint::new("http://127.0.0.1:7878").unwrap_err().to_string(),
            "invalid address \"http://127.0.0.1:7878\": not host:port; an address is host:port (10.0.0.1:7878, [::1]:7878, locks.internal:7878), not a URL"
        );
    }
}
