//! The connection id type that the client and server cores each define as
//! their own, so that one core's ids cannot be handed to the other.

/// Defines a connection id: a number, 1 for the first connection and then
/// up, shown as `conn#<n>`.
macro_rules! conn_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub(crate) u64);

        impl $name {
            /// The number behind the id (1 for the first connection, then
            /// up).
            pub const fn get(self) -> u64 {
                self.0
            }
        }

        impl core::fmt::Display for $name {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                write!(f, "conn#{}", self.0)
            }
        }
    };
}

pub(crate) use conn_id;
