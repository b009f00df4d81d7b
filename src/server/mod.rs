//! The reference server core (being written).
