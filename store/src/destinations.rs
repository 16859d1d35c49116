//! The outbox's destination policy (OL-24): which address classes — beyond public addresses —
//! the processes on this database may deliver to, kept in `ol_meta` under the key
//! `destinations`, so that every process (a relay, a library's outbox, a service that only
//! enqueues) judges a recipient alike.
//!
//! - Enqueue refuses a recipient whose address is known without a lookup (an IP literal,
//!   `localhost`) and which the stored policy refuses ([`EnqueueError::DestinationRefused`]),
//!   in every enqueue path: nothing is admitted that delivery would dead-letter at once.
//! - Opening an outbox whose configuration asks for more widens the stored policy
//!   ([`ServiceStore::widen_destination_policy`]): monotone, a union, never a narrowing.
//! - Delivery allows the union of its own configuration and the stored policy, read when the
//!   outbox opens and again at the start of each pass.
//! - Only an operator narrows it ([`ServiceStore::set_destination_policy`], `outbox-lanes
//!   destinations set`); the row `destinations_narrowed` remembers that, so the process that
//!   widens it again can say so.
//!
//! The stored text is [`policy_name`]'s: `public`, or the opened classes joined by `+`
//! (`loopback`, `loopback+private`, `loopback+private+link_local`). No row reads as `public`.
//!
//! [`EnqueueError::DestinationRefused`]: crate::EnqueueError::DestinationRefused
//! [`ServiceStore::widen_destination_policy`]: crate::ServiceStore::widen_destination_policy
//! [`ServiceStore::set_destination_policy`]: crate::ServiceStore::set_destination_policy

use outbox_lanes_core::policy::AddressPolicy;

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "sqlx"))]
pub(crate) use ops::*;

/// Every class a policy can open: what no policy allows is refused whatever is stored.
pub(crate) const WIDEST: AddressPolicy = AddressPolicy {
    allow_loopback: true,
    allow_private: true,
    allow_link_local: true,
};

/// What a change of the stored destination policy did
/// ([`ServiceStore::widen_destination_policy`](crate::ServiceStore::widen_destination_policy),
/// [`ServiceStore::set_destination_policy`](crate::ServiceStore::set_destination_policy)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PolicyChange {
    /// The stored policy before.
    pub before: AddressPolicy,
    /// The stored policy after.
    pub after: AddressPolicy,
    /// A widening that undid an operator's narrowing (the policy had been narrowed with
    /// [`ServiceStore::set_destination_policy`](crate::ServiceStore::set_destination_policy)
    /// since it was last widened).
    pub undid_narrowing: bool,
}

impl PolicyChange {
    /// Whether the stored policy changed.
    pub fn changed(&self) -> bool {
        self.before != self.after
    }
}

/// The policy that allows what either allows.
pub fn widest(a: AddressPolicy, b: AddressPolicy) -> AddressPolicy {
    AddressPolicy {
        allow_loopback: a.allow_loopback || b.allow_loopback,
        allow_private: a.allow_private || b.allow_private,
        allow_link_local: a.allow_link_local || b.allow_link_local,
    }
}

/// Whether `a` allows everything `b` allows.
pub fn covers(a: AddressPolicy, b: AddressPolicy) -> bool {
    widest(a, b) == a
}

/// The policy's name, as stored and shown: `public` (public addresses only), or the classes
/// it opens joined by `+`: `loopback`, `private` (private, shared CGNAT and unique local
/// space), `link_local`. `loopback+private` is what the binary's
/// `--allow-private-destinations` and the driver's `OutboxConfig::allow_private` open.
pub fn policy_name(p: AddressPolicy) -> String {
    let opened: Vec<&str> = [
        (p.allow_loopback, "loopback"),
        (p.allow_private, "private"),
        (p.allow_link_local, "link_local"),
    ]
    .into_iter()
    .filter_map(|(on, name)| on.then_some(name))
    .collect();
    if opened.is_empty() {
        "public".into()
    } else {
        opened.join("+")
    }
}

/// The policy [`policy_name`] names; `None` for any other text.
pub fn parse_policy_name(text: &str) -> Option<AddressPolicy> {
    let mut p = AddressPolicy::public_only();
    if text == "public" {
        return Some(p);
    }
    for part in text.split('+') {
        let flag = match part {
            "loopback" => &mut p.allow_loopback,
            "private" => &mut p.allow_private,
            "link_local" => &mut p.allow_link_local,
            _ => return None,
        };
        if std::mem::replace(flag, true) {
            return None;
        }
    }
    Some(p)
}

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "sqlx"))]
mod ops {
    use outbox_lanes_core::policy::AddressPolicy;

    use super::{PolicyChange, covers, parse_policy_name, policy_name, widest};
    use crate::StoreError;
    use crate::db::{AsyncDb, Db, Sql, args};

    static READ: Sql = Sql::new("SELECT value FROM ol_meta WHERE key = 'destinations'");
    /// The policy and whether an operator narrowed it since it was last widened, locked on
    /// Postgres to the commit: two processes widening at once both keep what the other added.
    static READ_FOR_CHANGE: Sql = Sql::new(
        "SELECT value, EXISTS (SELECT 1 FROM ol_meta WHERE key = 'destinations_narrowed') \
         FROM ol_meta WHERE key = 'destinations' {lock}",
    );
    /// The row [`READ_FOR_CHANGE`] locks, made if there is none.
    static ENSURE: Sql = Sql::new(
        "INSERT INTO ol_meta (key, value) VALUES ('destinations', 'public') \
         ON CONFLICT (key) DO NOTHING",
    );
    static WRITE: Sql = Sql::new("UPDATE ol_meta SET value = $1 WHERE key = 'destinations'");
    static MARK_NARROWED: Sql = Sql::new(
        "INSERT INTO ol_meta (key, value) VALUES ('destinations_narrowed', '1') \
         ON CONFLICT (key) DO NOTHING",
    );
    static CLEAR_NARROWED: Sql =
        Sql::new("DELETE FROM ol_meta WHERE key = 'destinations_narrowed'");

    fn parse(text: &str) -> Result<AddressPolicy, StoreError> {
        parse_policy_name(text).ok_or_else(|| {
            StoreError::Database(format!(
                "ol_meta's destinations row holds {text:?}, not a destination policy this \
                 version reads (public, or loopback, private, link_local joined by '+'); \
                 set it with `outbox-lanes destinations set`"
            ))
        })
    }

    /// The stored policy (public when there is no row).
    pub(crate) async fn read(db: &mut impl AsyncDb) -> Result<AddressPolicy, StoreError> {
        match db.query_opt(&READ, args![], |r| r.text(0)).await? {
            Some(text) => parse(&text),
            None => Ok(AddressPolicy::public_only()),
        }
    }

    /// The stored policy and the narrowed mark, the row locked (made first if missing).
    fn read_for_change(db: &mut impl Db) -> Result<(AddressPolicy, bool), StoreError> {
        db.execute(&ENSURE, &[])?;
        let (text, narrowed) =
            db.query_one(&READ_FOR_CHANGE, &[], |r| Ok((r.text(0)?, r.flag(1)?)))?;
        Ok((parse(&text)?, narrowed))
    }

    /// Widens the stored policy to allow what `wanted` allows too, in the caller's write
    /// transaction. Call it only when [`read`] found it narrower (a read needs no write
    /// access): under the lock it is read again, so a concurrent change is kept.
    pub(crate) fn widen(
        db: &mut impl Db,
        wanted: AddressPolicy,
    ) -> Result<PolicyChange, StoreError> {
        let (before, narrowed) = read_for_change(db)?;
        let after = widest(before, wanted);
        if after == before {
            return Ok(PolicyChange {
                before,
                after,
                undid_narrowing: false,
            });
        }
        db.execute(&WRITE, args![policy_name(after).as_str()])?;
        if narrowed {
            db.execute(&CLEAR_NARROWED, &[])?;
        }
        Ok(PolicyChange {
            before,
            after,
            undid_narrowing: narrowed,
        })
    }

    /// Sets the stored policy to `policy` (an operator's act: it may narrow it, and a
    /// narrowing is marked), in the caller's write transaction.
    pub(crate) fn set(db: &mut impl Db, policy: AddressPolicy) -> Result<PolicyChange, StoreError> {
        let (before, _) = read_for_change(db)?;
        db.execute(&WRITE, args![policy_name(policy).as_str()])?;
        if covers(policy, before) {
            db.execute(&CLEAR_NARROWED, &[])?;
        } else {
            db.execute(&MARK_NARROWED, &[])?;
        }
        Ok(PolicyChange {
            before,
            after: policy,
            undid_narrowing: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for bits in 0..8u8 {
            let p = AddressPolicy {
                allow_loopback: bits & 1 != 0,
                allow_private: bits & 2 != 0,
                allow_link_local: bits & 4 != 0,
            };
            assert_eq!(parse_policy_name(&policy_name(p)), Some(p), "{bits}");
        }
        assert_eq!(policy_name(AddressPolicy::default()), "public");
        let private = AddressPolicy {
            allow_loopback: true,
            allow_private: true,
            allow_link_local: false,
        };
        assert_eq!(policy_name(private), "loopback+private");
        for bad in [
            "",
            "Public",
            "loopback+",
            "loopback+loopback",
            "private+public",
            "lan",
        ] {
            assert_eq!(parse_policy_name(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn widest_is_a_union_and_covers_orders_it() {
        let l = AddressPolicy::allow_loopback_only();
        let p = AddressPolicy {
            allow_private: true,
            ..AddressPolicy::default()
        };
        let both = widest(l, p);
        assert!(both.allow_loopback && both.allow_private && !both.allow_link_local);
        assert!(covers(both, l) && covers(both, p) && !covers(l, p) && !covers(p, l));
        assert!(covers(l, AddressPolicy::default()));
        assert!(covers(WIDEST, both));
    }
}
