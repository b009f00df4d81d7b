//! Atoms and addresses as they appear in frames, borrowed from a line.

use core::fmt;

use super::error::AtomError;

/// The longest atom, in bytes.
pub const MAX_ATOM: usize = 250;

/// A validated atom borrowed from somewhere: 1 to 250 bytes, each in
/// `0x21..=0x7E`. Keys, owners, client ids, credentials, node ids and error
/// reasons are atoms.
///
/// It keeps the atom's bytes: the parser has checked them, and turning them
/// into a `str` checks them again, which only [`Atom::as_str`] does.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Atom<'a>(&'a [u8]);

impl<'a> Atom<'a> {
    /// Checks that `s` is an atom.
    pub fn new(s: &'a str) -> Result<Atom<'a>, AtomError> {
        check_atom(s.as_bytes())?;
        Ok(Atom(s.as_bytes()))
    }

    /// The atom's text.
    pub fn as_str(self) -> &'a str {
        core::str::from_utf8(self.0).expect("an atom is printable ASCII")
    }

    /// The atom's bytes.
    pub fn as_bytes(self) -> &'a [u8] {
        self.0
    }

    /// Wraps bytes the parser has checked to be an atom.
    pub(crate) fn from_checked(bytes: &'a [u8]) -> Atom<'a> {
        debug_assert!(check_atom(bytes).is_ok());
        Atom(bytes)
    }

    /// Wraps text checked to be an atom when it was made (an owned
    /// [`Key`](crate::Key) or [`Name`](crate::Name)), without checking it
    /// again.
    pub(crate) fn trusted(s: &'a str) -> Atom<'a> {
        debug_assert!(check_atom(s.as_bytes()).is_ok());
        Atom(s.as_bytes())
    }
}

impl fmt::Debug for Atom<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for Atom<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A validated `host:port` address borrowed from somewhere: an atom whose
/// last `:` separates a non-empty host from a canonical port number up to
/// 65535. Leader hints (`L`) and redirects (`M`) carry addresses.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Addr<'a>(&'a str);

impl<'a> Addr<'a> {
    /// Checks that `s` is an address.
    pub fn new(s: &'a str) -> Result<Addr<'a>, AtomError> {
        check_atom(s.as_bytes())?;
        if !is_host_port(s.as_bytes()) {
            return Err(AtomError::NotAnAddress);
        }
        Ok(Addr(s))
    }

    /// Wraps text checked to be an address when it was made (an owned
    /// [`Endpoint`](crate::Endpoint)), without checking it again.
    pub(crate) fn trusted(s: &'a str) -> Addr<'a> {
        debug_assert!(check_atom(s.as_bytes()).is_ok() && is_host_port(s.as_bytes()));
        Addr(s)
    }

    /// The address's text.
    pub fn as_str(self) -> &'a str {
        self.0
    }

    /// The address's bytes.
    pub fn as_bytes(self) -> &'a [u8] {
        self.0.as_bytes()
    }

    /// The address as a plain atom.
    pub fn as_atom(self) -> Atom<'a> {
        Atom(self.0.as_bytes())
    }
}

impl fmt::Debug for Addr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.0, f)
    }
}

impl fmt::Display for Addr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// Checks the atom rules on raw bytes.
pub(crate) fn check_atom(bytes: &[u8]) -> Result<(), AtomError> {
    if bytes.is_empty() {
        return Err(AtomError::Empty);
    }
    if bytes.len() > MAX_ATOM {
        return Err(AtomError::TooLong { len: bytes.len() });
    }
    match bytes.iter().position(|b| !(0x21..=0x7e).contains(b)) {
        Some(at) => Err(AtomError::InvalidByte {
            at,
            byte: bytes[at],
        }),
        None => Ok(()),
    }
}

/// `host:port` with a non-empty host and a canonical port in `0..=65535`.
/// The host is everything before the last `:`, so `[::1]:7878` is accepted.
pub(crate) fn is_host_port(bytes: &[u8]) -> bool {
    let Some(colon) = bytes.iter().rposition(|&b| b == b':') else {
        return false;
    };
    let (host, port) = (&bytes[..colon], &bytes[colon + 1..]);
    if host.is_empty() || port.is_empty() || port.len() > 5 {
        return false;
    }
    if port.len() > 1 && port[0] == b'0' {
        return false;
    }
    let mut value: u32 = 0;
    for &b in port {
        if !b.is_ascii_digit() {
            return false;
        }
        value = value * 10 + u32::from(b - b'0');
    }
    value <= u32::from(u16::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atoms_follow_section_2() {
        assert_eq!(Atom::new(""), Err(AtomError::Empty));
        assert!(Atom::new(&"k".repeat(250)).is_ok());
        assert_eq!(
            Atom::new(&"k".repeat(251)),
            Err(AtomError::TooLong { len: 251 })
        );
        assert_eq!(
            Atom::new("a b"),
            Err(AtomError::InvalidByte { at: 1, byte: b' ' })
        );
        assert_eq!(
            Atom::new("a\u{7f}"),
            Err(AtomError::InvalidByte { at: 1, byte: 0x7f })
        );
        assert!(Atom::new("!~").is_ok());
    }

    #[test]
    fn addresses_are_host_colon_port() {
        for ok in ["a:0", "127.0.0.1:7878", "[::1]:65535", "node-1.example:1"] {
            assert!(Addr::new(ok).is_ok(), "{ok}");
        }
        for bad in ["a", ":1", "a:", "a:65536", "a:01", "a:1x", "a:123456"] {
            assert_eq!(Addr::new(bad), Err(AtomError::NotAnAddress), "{bad}");
        }
    }
}
