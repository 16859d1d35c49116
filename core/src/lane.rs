//! Lane keys and their interning into dense integer ids (OL-19).

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;
use core::hash::{BuildHasher, Hash};

use hashbrown::HashMap;
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

/// Interns lane keys into dense [`LaneId`]s.
#[derive(Clone, Debug)]
pub struct LaneTable<K = LaneKey> {
    ids: HashMap<K, LaneId, KeyedState>,
    keys: Vec<K>,
}

impl<K: Clone + Eq + Hash> LaneTable<K> {
    /// An empty table whose hasher is keyed from `seed`.
    pub fn new(seed: u64) -> Self {
        LaneTable {
            ids: HashMap::with_hasher(KeyedState::new(seed)),
            keys: Vec::new(),
        }
    }

    /// The id of `key`, interning it on first sight.
    ///
    /// # Panics
    /// Never in practice: it would need more than `u32::MAX` distinct lanes in one table.
    pub fn intern(&mut self, key: &K) -> LaneId {
        if let Some(id) = self.ids.get(key) {
            return *id;
        }
        let id = LaneId(u32::try_from(self.keys.len()).expect("fewer than 2^32 lanes"));
        self.keys.push(key.clone());
        self.ids.insert(key.clone(), id);
        id
    }

    /// The id of `key`, if it was interned.
    pub fn get(&self, key: &K) -> Option<LaneId> {
        self.ids.get(key).copied()
    }

    /// The key of `id`, if `id` came from this table.
    pub fn key(&self, id: LaneId) -> Option<&K> {
        self.keys.get(id.index())
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
