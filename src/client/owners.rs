//! The owners of the acquires in the table, each kept once.
//!
//! An acquire needs its owner only to write it into its requests. Most
//! embedders clone one [`Name`] into many acquires, so the table keeps each
//! owner once, with a count of the acquires that use it, and an acquire
//! holds a 4-byte number instead of the name: that keeps an entry, its
//! generation and its timer within one cache line. An owner is known by the
//! address of its shared text (two equal names made apart are two owners;
//! that is harmless), and the owner of the latest acquire is checked first.

use core::hash::{BuildHasherDefault, Hasher};
use std::collections::HashMap;

use crate::names::Name;

const NONE: u32 = u32::MAX;

/// An acquire's owner in [`Owners`]. Deliberately neither `Clone` nor
/// `Copy`: each is handed back once, with [`Owners::release`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct OwnerId(u32);

struct Owner {
    name: Option<Name>,
    /// Acquires using it; the next free owner while `name` is `None`.
    uses: usize,
    next_free: u32,
}

/// Hashes an address: one multiplication, whose top bits are well mixed.
#[derive(Default)]
struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u64(u64::from(byte));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

/// The owners in use, each once.
#[derive(Default)]
pub(crate) struct Owners {
    owners: Vec<Owner>,
    free: Option<u32>,
    /// The owner of the latest acquire.
    last: Option<u32>,
    by_addr: HashMap<usize, u32, BuildHasherDefault<AddrHasher>>,
}

impl Owners {
    /// Takes `name` as the owner of one more acquire.
    #[inline]
    pub(crate) fn intern(&mut self, name: Name) -> OwnerId {
        if let Some(last) = self.last {
            let owner = &mut self.owners[last as usize];
            if owner.name.as_ref().is_some_and(|n| n.same(&name)) {
                owner.uses += 1;
                return OwnerId(last);
            }
        }
        self.intern_other(name)
    }

    fn intern_other(&mut self, name: Name) -> OwnerId {
        let number = match self.by_addr.get(&name.addr()) {
            Some(&number) => {
                self.owners[number as usize].uses += 1;
                number
            }
            None => {
                let owner = Owner {
                    name: None,
                    uses: 1,
                    next_free: NONE,
                };
                let number = match self.free {
                    Some(number) => {
                        let next = self.owners[number as usize].next_free;
                        self.free = (next != NONE).then_some(next);
                        self.owners[number as usize] = owner;
                        number
                    }
                    None => {
                        self.owners.push(owner);
                        (self.owners.len() - 1) as u32
                    }
                };
                self.by_addr.insert(name.addr(), number);
                self.owners[number as usize].name = Some(name);
                number
            }
        };
        self.last = Some(number);
        OwnerId(number)
    }

    /// The owner's name.
    #[inline]
    pub(crate) fn get(&self, id: &OwnerId) -> &Name {
        self.owners[id.0 as usize]
            .name
            .as_ref()
            .expect("an owner in use")
    }

    /// One acquire less uses the owner.
    #[inline]
    pub(crate) fn release(&mut self, id: OwnerId) {
        let owner = &mut self.owners[id.0 as usize];
        owner.uses -= 1;
        if owner.uses == 0 {
            self.forget(id.0);
        }
    }

    fn forget(&mut self, number: u32) {
        let owner = &mut self.owners[number as usize];
        let name = owner.name.take().expect("an owner in use");
        owner.next_free = self.free.unwrap_or(NONE);
        self.free = Some(number);
        self.by_addr.remove(&name.addr());
        if self.last == Some(number) {
            self.last = None;
        }
    }

    /// How many acquires use an owner, in all.
    pub(crate) fn uses(&self) -> usize {
        self.owners
            .iter()
            .filter(|owner| owner.name.is_some())
            .map(|owner| owner.uses)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_are_kept_once_and_forgotten_when_unused() {
        let mut owners = Owners::default();
        let a = Name::new("a").unwrap();
        let b = Name::new("b").unwrap();
        let other_a = Name::new("a").unwrap();
        let ids: Vec<OwnerId> = [&a, &a, &b, &a, &other_a, &b]
            .into_iter()
            .map(|name| owners.intern(name.clone()))
            .collect();
        assert_eq!(owners.uses(), 6);
        assert_eq!(ids[0], ids[1]);
        assert_eq!(ids[0], ids[3]);
        assert_eq!(ids[2], ids[5]);
        assert_ne!(ids[0], ids[4], "told apart by address");
        for id in &ids {
            assert!(["a", "b"].contains(&owners.get(id).as_str()));
        }
        assert_eq!(owners.get(&ids[2]).as_str(), "b");
        for id in ids {
            owners.release(id);
        }
        assert_eq!(owners.uses(), 0);
        assert!(owners.by_addr.is_empty());
        // Numbers are reused.
        let c = owners.intern(Name::new("c").unwrap());
        assert!(c.0 < 3);
        owners.release(c);
    }
}
