//! Lane keys and their interning into dense integer ids (OL-19).
//!
//! [`LaneTable`] is an [`IndexSet`]: a key's index in insertion order is its [`LaneId`], so
//! each key is stored once and `insert_full` interns in one call. Without std, indexmap
//! needs its hasher named: the table uses [`KeyedState`], a SipHash-1-3 keyed from the
//! scheduler's seed, rather than an unkeyed no_std hasher (foldhash, ahash without its
//! runtime RNG), because recipient URLs come from outside and whoever picks them must not be
//! able to aim them at one bucket. Keying from the seed keeps runs replayable.

use alloc::string::String;
use core::fmt;
use core::hash::{BuildHasher, Hash};

use indexmap::IndexSet;
use siphasher::sip::SipHasher13;

use crate::ids::LaneId;
use crate::policy::url::{Recipient, UrlError};

/// The key of a lane: a canonical recipient URL, optionally narrowed by an ordering key.
///
/// Two spellings of one inbox (`HTTP://Example.COM:80/inbox` and `http://example.com/inbox`)
/// give the same key, so they are one lane.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct LaneKey {
    recipient: String,
    ordering_key: Option<String>,
}

impl LaneKey {
    /// The lane of `recipient` (canonicalised), narrowed by `ordering_key` if given.
    ///
    /// # Errors
    /// [`UrlError`] when `recipient` is not an absolute http(s) URL.
    pub fn new(recipient: &str, ordering_key: Option<&str>) -> Result<Self, UrlError> {
        let canonical = Recipient::parse(recipient)?;
        Ok(LaneKey {
            recipient: String::from(canonical.as_str()),
            ordering_key: ordering_key.map(String::from),
        })
    }

    /// A lane key from a recipient that is already canonical (as stored by the store).
    pub fn from_canonical(recipient: String, ordering_key: Option<String>) -> Self {
        LaneKey {
            recipient,
            ordering_key,
        }
    }

    /// The canonical recipient URL.
    pub fn recipient(&self) -> &str {
        &self.recipient
    }

    /// The ordering key narrowing this lane, if any.
    pub fn ordering_key(&self) -> Option<&str> {
        self.ordering_key.as_deref()
    }
}

impl fmt::Debug for LaneKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.ordering_key {
            Some(k) => write!(f, "{}#{}", self.recipient, k),
            None => f.write_str(&self.recipient),
        }
    }
}

/// A keyed SipHash-1-3 builder: recipient strings come from outside, so lane hashing must
/// not be predictable by whoever picks them.
#[derive(Clone, Copy, Debug)]
pub struct KeyedState {
    k0: u64,
    k1: u64,
}

impl KeyedState {
    /// A hasher keyed from `seed`.
    pub fn new(seed: u64) -> Self {
        let mut rng = crate::rng::Rng::new(seed ^ 0x6c61_6e65_6b65_7973);
        KeyedState {
            k0: rng.next_u64(),
            k1: rng.next_u64(),
        }
    }
}

impl BuildHasher for KeyedState {
    type Hasher = SipHasher13;
    fn build_hasher(&self) -> SipHasher13 {
        SipHasher13::new_with_keys(self.k0, self.k1)
    }
}

/// Interns lane keys into dense [`LaneId`]s (a key's id is its index in insertion order).
#[derive(Clone, Debug)]
pub struct LaneTable<K = LaneKey> {
    keys: IndexSet<K, KeyedState>,
}

impl<K: Clone + Eq + Hash> LaneTable<K> {
    /// An empty table whose hasher is keyed from `seed`.
    pub fn new(seed: u64) -> Self {
        LaneTable {
            keys: IndexSet::with_hasher(KeyedState::new(seed)),
        }
    }

    /// The id of `key`, interning it on first sight.
    ///
    /// # Panics
    /// Never in practice: it would need more than `u32::MAX` distinct lanes in one table.
    pub fn intern(&mut self, key: &K) -> LaneId {
        // Looked up first so that a known key (the common case) is not cloned.
        let index = match self.keys.get_index_of(key) {
            Some(index) => index,
            None => self.keys.insert_full(key.clone()).0,
        };
        LaneId(u32::try_from(index).expect("fewer than 2^32 lanes"))
    }

    /// The id of `key`, if it was interned.
    pub fn get(&self, key: &K) -> Option<LaneId> {
        // Every index in the table came from `intern`, which checked it fits.
        self.keys
            .get_index_of(key)
            .and_then(|index| u32::try_from(index).ok())
            .map(LaneId)
    }

    /// The key of `id`, if `id` came from this table.
    pub fn key(&self, id: LaneId) -> Option<&K> {
        self.keys.get_index(id.index())
    }

    /// The number of interned lanes.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether no lane was interned.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interning_is_stable_and_dense() {
        let mut t: LaneTable<String> = LaneTable::new(7);
        let a = t.intern(&String::from("a"));
        let b = t.intern(&String::from("b"));
        assert_eq!(t.intern(&String::from("a")), a);
        assert_eq!((a.index(), b.index()), (0, 1));
        assert_eq!(t.key(b).map(String::as_str), Some("b"));
        assert_eq!(t.get(&String::from("c")), None);
    }

    #[test]
    fn each_key_is_stored_once_and_ids_follow_insertion_order() {
        let mut t: LaneTable<u64> = LaneTable::new(3);
        for round in 0..3 {
            for k in (0..1_000_u64).rev() {
                let id = t.intern(&k);
                assert_eq!(
                    id.index(),
                    999 - usize::try_from(k).unwrap_or(0),
                    "round {round}"
                );
                assert_eq!(t.key(id), Some(&k));
                assert_eq!(t.get(&k), Some(id));
            }
            assert_eq!(t.len(), 1_000);
        }
        assert_eq!(t.key(LaneId(1_000)), None);
        assert!(!t.is_empty() && LaneTable::<u64>::new(3).is_empty());
    }
}

#[cfg(test)]
mod key_tests {
    use super::*;

    #[test]
    fn two_spellings_are_one_lane_and_an_ordering_key_narrows_it() {
        let a = LaneKey::new("HTTP://Example.COM:80/inbox", None).expect("valid");
        let b = LaneKey::new("http://example.com/inbox", None).expect("valid");
        assert_eq!(a, b);
        let c = LaneKey::new("http://example.com/inbox", Some("conversation-1")).expect("valid");
        assert_ne!(a, c);
        assert_eq!(c.ordering_key(), Some("conversation-1"));
        let mut t: LaneTable = LaneTable::new(1);
        assert_eq!(t.intern(&a), t.intern(&b));
        assert_ne!(t.intern(&a), t.intern(&c));
        assert!(LaneKey::new("/relative/inbox", None).is_err());
    }
}
