//! What can be wrong with bytes on the wire.

use thiserror::Error;

/// Why a string is not an atom (PROTOCOL.md section 2). Its text says what
/// is wrong, in words: "empty", "251 bytes", "a space (0x20) at offset 2".
/// The rule it breaks is said by whoever knows what the atom was to be
/// ([`InvalidValue`](crate::InvalidValue) for keys, names and addresses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum AtomError {
    /// An atom has at least one byte.
    #[error("empty")]
    Empty,
    /// An atom has at most 250 bytes.
    #[error("{len} bytes, more than 250")]
    TooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// Every byte of an atom is in `0x21..=0x7E` (printable, no space).
    #[error("{} (0x{byte:02x}) at offset {at}", byte_name(*byte))]
    InvalidByte {
        /// Offset of the byte in the atom.
        at: usize,
        /// The byte.
        byte: u8,
    },
    /// An address is `host:port` with a non-empty host and a canonical port
    /// number up to 65535.
    #[error("not host:port")]
    NotAnAddress,
}

/// What a byte an atom cannot hold is, in words.
fn byte_name(byte: u8) -> &'static str {
    match byte {
        b' ' => "a space",
        b'\t' => "a tab",
        b'\n' | b'\r' => "a line break",
        0x00..=0x1f | 0x7f => "a control byte",
        _ => "a byte beyond ASCII",
    }
}

/// Why a line is not a valid frame. Every variant is a protocol violation:
/// the receiver closes the connection.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum FrameError {
    /// Byte 1025 of a line arrived and no `\n` came before it.
    #[error("line longer than 1024 bytes")]
    LineTooLong,
    /// Frames end in a bare LF; a CR anywhere is an error.
    #[error("carriage return at offset {at}")]
    CarriageReturn {
        /// Offset of the CR in the line.
        at: usize,
    },
    /// A byte that is not printable ASCII (`0x20..=0x7E`).
    #[error("byte 0x{byte:02x} at offset {at} is not printable ascii")]
    InvalidByte {
        /// Offset of the byte in the line.
        at: usize,
        /// The byte.
        byte: u8,
    },
    /// A line with nothing before its `\n`.
    #[error("empty line")]
    EmptyLine,
    /// Two spaces in a row, or a space at the start or end of the line.
    #[error("empty field {index} (fields are separated by exactly one space)")]
    EmptyField {
        /// Zero-based index of the empty field.
        index: usize,
    },
    /// The first field names no frame this side can receive.
    #[error("unknown frame kind {kind:?}")]
    UnknownKind {
        /// The first field (at most 16 bytes of it).
        kind: String,
    },
    /// A known kind with the wrong number of fields.
    #[error("frame {kind} has {expected} fields, this one has {found}")]
    FieldCount {
        /// The frame kind.
        kind: char,
        /// How many fields that kind has.
        expected: usize,
        /// How many fields arrived (8 means "more than 7").
        found: usize,
    },
    /// An atom field longer than 250 bytes.
    #[error("field {field} is longer than 250 bytes ({len})")]
    AtomTooLong {
        /// The field's name.
        field: &'static str,
        /// Its length.
        len: usize,
    },
    /// A number field with a character other than a decimal digit.
    #[error("field {field} is not a decimal number")]
    NotANumber {
        /// The field's name.
        field: &'static str,
    },
    /// A number with a leading zero (only `0` itself may start with `0`).
    #[error("field {field} has a leading zero")]
    LeadingZero {
        /// The field's name.
        field: &'static str,
    },
    /// A number above `u64::MAX`.
    #[error("field {field} overflows u64")]
    Overflow {
        /// The field's name.
        field: &'static str,
    },
    /// The op field of an answer is neither `A` nor `R`.
    #[error("op field must be A or R")]
    BadOp,
    /// An answer kind paired with the wrong op (`G <id> R ...`, `D <id> A ...`).
    #[error("answer {kind} cannot answer op {op}")]
    BadPairing {
        /// The answer kind.
        kind: char,
        /// The op it named.
        op: char,
    },
    /// `lease_ms` is at least 1.
    #[error("lease_ms must be at least 1")]
    ZeroLease,
    /// A `W` window is at least 2.
    #[error("window must be at least 2, got {window}")]
    WindowTooSmall {
        /// The window that arrived.
        window: u64,
    },
    /// An address field that is not `host:port`.
    #[error("field {field} is not host:port")]
    BadAddress {
        /// The field's name.
        field: &'static str,
    },
}

impl FrameError {
    /// A short machine-readable name of the rule that was broken.
    pub fn code(&self) -> &'static str {
        match self {
            FrameError::LineTooLong => "line_too_long",
            FrameError::CarriageReturn { .. } => "carriage_return",
            FrameError::InvalidByte { .. } => "invalid_byte",
            FrameError::EmptyLine => "empty_line",
            FrameError::EmptyField { .. } => "empty_field",
            FrameError::UnknownKind { .. } => "unknown_kind",
            FrameError::FieldCount { .. } => "field_count",
            FrameError::AtomTooLong { .. } => "atom_too_long",
            FrameError::NotANumber { .. } => "not_a_number",
            FrameError::LeadingZero { .. } => "leading_zero",
            FrameError::Overflow { .. } => "overflow",
            FrameError::BadOp => "bad_op",
            FrameError::BadPairing { .. } => "bad_pairing",
            FrameError::ZeroLease => "zero_lease",
            FrameError::WindowTooSmall { .. } => "window_too_small",
            FrameError::BadAddress { .. } => "bad_address",
        }
    }
}
