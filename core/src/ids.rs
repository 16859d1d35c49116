//! Typed identifiers.

use alloc::string::String;
use alloc::sync::Arc;
use core::fmt;

/// A unit's id, assigned by the store and unique across actors.
///
/// It is the idempotency key sent with every attempt (`Idempotency-Key`, `webhook-id`).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct UnitId(pub u64);

/// A row's enqueue sequence number within its actor's outbox. Immutable once assigned:
/// handing a unit back never changes it (OL-10).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Seq(pub u64);

/// A lane interned by one scheduler: a dense integer, valid only for the scheduler that
/// issued it.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LaneId(pub(crate) u32);

impl LaneId {
    /// The dense index of this lane.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// A canonical actor id: the name of one outbox.
///
/// Aliases (a short id, a full URI) are mapped to one `ActorId` by the runtime's resolver
/// hook before they reach the core.
///
/// Shared, not copied: a clone (one per attempt, per job, per store call) is a reference
/// count, not an allocation.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(from = "String", into = "String")
)]
pub struct ActorId(Arc<str>);

impl ActorId {
    /// Wraps an already canonical actor id.
    pub fn new(id: impl Into<String>) -> Self {
        ActorId(Arc::from(id.into()))
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for UnitId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "u{}", self.0)
    }
}

impl fmt::Display for UnitId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Debug for Seq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

impl fmt::Debug for LaneId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "L{}", self.0)
    }
}

impl fmt::Debug for ActorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

/// An actor id given as text (already canonical, as [`ActorId::new`]).
impl From<&str> for ActorId {
    fn from(id: &str) -> Self {
        ActorId::new(id)
    }
}

impl From<String> for ActorId {
    fn from(id: String) -> Self {
        ActorId(Arc::from(id))
    }
}

impl From<ActorId> for String {
    fn from(id: ActorId) -> Self {
        String::from(&*id.0)
    }
}

/// So that an API taking `impl Into<ActorId>` takes `&String` too.
impl From<&String> for ActorId {
    fn from(id: &String) -> Self {
        ActorId::new(id.as_str())
    }
}

/// So that an API taking `impl Into<ActorId>` takes `&ActorId` too.
impl From<&ActorId> for ActorId {
    fn from(id: &ActorId) -> Self {
        id.clone()
    }
}

/// So that an API taking `impl AsRef<str>` takes an `ActorId` (or `&ActorId`) too.
impl AsRef<str> for ActorId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ActorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::ActorId;
    use alloc::string::{String, ToString};

    fn id(actor: impl Into<ActorId>) -> ActorId {
        actor.into()
    }

    fn text(actor: impl AsRef<str>) -> String {
        actor.as_ref().to_string()
    }

    /// Every way a caller holds an actor's name converts to the same id, and reads back as
    /// the same text.
    #[test]
    fn every_spelling_of_an_actor_converts() {
        let owned = String::from("alice");
        let canonical = ActorId::new("alice");
        let all = [
            id("alice"),
            id(owned.clone()),
            id(&owned),
            id(canonical.clone()),
            id(&canonical),
        ];
        assert!(all.iter().all(|a| *a == canonical), "{all:?}");
        assert_eq!(text(&canonical), "alice");
        assert_eq!(text(canonical), "alice");
    }
}
