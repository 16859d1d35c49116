//! The in-process drain-slot registry (OL-12): at most one pass per actor at a time, and a
//! second request never waits.

use alloc::collections::BTreeMap;
use alloc::string::String;
use core::fmt;

use crate::ids::ActorId;

/// What a drain request got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a caller that acquired the slot must release it"]
pub enum Acquire {
    /// The caller holds the slot: run the pass, then [`DrainSlots::release`].
    Acquired,
    /// A pass is running (perhaps the caller's own, further up its stack): it was told to
    /// look once more before it releases. Come back later; do not wait.
    Merged,
}

/// What releasing the slot means for its holder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "LookAgain means the holder still holds the slot"]
pub enum Release {
    /// The slot is free.
    Released,
    /// Someone asked for a drain while the pass ran: the holder keeps the slot, must read
    /// the outbox again, and release again afterwards.
    LookAgain,
}

/// Maps actor aliases (a short id, a full URI) to one canonical [`ActorId`].
pub trait ActorResolver {
    /// The canonical id of `spelled`.
    ///
    /// # Errors
    /// [`UnknownActor`] when `spelled` names no known actor.
    fn resolve(&self, spelled: &str) -> Result<ActorId, UnknownActor>;
}

/// The resolver for services without aliases: every spelling is its own canonical id,
/// after trimming surrounding whitespace; an empty id is refused.
#[derive(Clone, Copy, Debug, Default)]
pub struct IdentityResolver;

impl ActorResolver for IdentityResolver {
    fn resolve(&self, spelled: &str) -> Result<ActorId, UnknownActor> {
        let id = spelled.trim();
        if id.is_empty() {
            return Err(UnknownActor(String::from(spelled)));
        }
        Ok(ActorId::new(id))
    }
}

/// A resolver from a fixed alias table; unknown spellings are refused.
#[derive(Clone, Debug, Default)]
pub struct AliasResolver {
    aliases: BTreeMap<String, ActorId>,
}

impl AliasResolver {
    /// An empty table.
    pub fn new() -> Self {
        AliasResolver::default()
    }

    /// Declares `canonical` with its `aliases` (the canonical id names itself too).
    pub fn actor(mut self, canonical: &str, aliases: &[&str]) -> Self {
        let id = ActorId::new(canonical);
        self.aliases.insert(String::from(canonical), id.clone());
        for a in aliases {
            self.aliases.insert(String::from(*a), id.clone());
        }
        self
    }
}

impl ActorResolver for AliasResolver {
    fn resolve(&self, spelled: &str) -> Result<ActorId, UnknownActor> {
        self.aliases
            .get(spelled.trim())
            .cloned()
            .ok_or_else(|| UnknownActor(String::from(spelled)))
    }
}

/// No actor has this id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownActor(pub String);

impl fmt::Display for UnknownActor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown actor {:?}", self.0)
    }
}

/// The registry of drain slots, keyed by canonical actor id.
///
/// A request that finds the slot held does not wait: waiting has a deadlock class (a
/// delivery that re-enters the drain of the same actor from inside the pass).
#[derive(Clone, Debug, Default)]
pub struct DrainSlots {
    held: BTreeMap<ActorId, bool>,
}

impl DrainSlots {
    /// An empty registry.
    pub fn new() -> Self {
        DrainSlots::default()
    }

    /// Takes `actor`'s slot, or marks the running pass to look once more.
    pub fn try_acquire(&mut self, actor: &ActorId) -> Acquire {
        match self.held.get_mut(actor) {
            Some(look_again) => {
                *look_again = true;
                Acquire::Merged
            }
            None => {
                self.held.insert(actor.clone(), false);
                Acquire::Acquired
            }
        }
    }

    /// Resolves `spelled` and takes the slot of the actor it names.
    ///
    /// # Errors
    /// [`UnknownActor`] from the resolver.
    pub fn try_acquire_spelled(
        &mut self,
        resolver: &impl ActorResolver,
        spelled: &str,
    ) -> Result<(ActorId, Acquire), UnknownActor> {
        let actor = resolver.resolve(spelled)?;
        let acquired = self.try_acquire(&actor);
        Ok((actor, acquired))
    }

    /// Releases `actor`'s slot, unless someone asked for a drain meanwhile: then the holder
    /// keeps it and must look again. Releasing a slot that is not held is a no-op.
    pub fn release(&mut self, actor: &ActorId) -> Release {
        match self.held.get_mut(actor) {
            Some(look_again) if *look_again => {
                *look_again = false;
                Release::LookAgain
            }
            Some(_) => {
                self.held.remove(actor);
                Release::Released
            }
            None => Release::Released,
        }
    }

    /// Releases `actor`'s slot whatever was asked meanwhile (an interrupted pass), returning
    /// whether a drain was asked for, so the caller can schedule one.
    pub fn force_release(&mut self, actor: &ActorId) -> bool {
        self.held.remove(actor).unwrap_or(false)
    }

    /// Whether a pass of `actor` is running.
    pub fn is_held(&self, actor: &ActorId) -> bool {
        self.held.contains_key(actor)
    }

    /// How many passes are running.
    pub fn running(&self) -> usize {
        self.held.len()
    }
}
