//! `outbox-lanes destinations`: the outbox's destination policy (OL-24) — which addresses
//! beyond public ones every process on the database may enqueue for and deliver to — and an
//! operator's `set`, the one way to narrow it.

use outbox_lanes_core::policy::AddressPolicy;
use outbox_lanes_store::{PolicyChange, policy_name};
use serde::Serialize;
use tracing::{info, warn};

use super::args::{DestinationsAction, DestinationsArg, DestinationsArgs};
use super::backend::Backend;
use super::{print, print_json};

/// The policy `destinations set` stores for `arg`.
fn policy_of(arg: DestinationsArg) -> AddressPolicy {
    match arg {
        DestinationsArg::Public => AddressPolicy::public_only(),
        DestinationsArg::Loopback => AddressPolicy::allow_loopback_only(),
        DestinationsArg::Private => super::address_policy(true),
    }
}

/// What a policy allows, in words.
fn allows(p: AddressPolicy) -> String {
    let mut classes = vec!["public"];
    if p.allow_loopback {
        classes.push("loopback");
    }
    if p.allow_private {
        classes.push("private-range");
    }
    if p.allow_link_local {
        classes.push("link-local");
    }
    let last = classes.pop().unwrap_or("public");
    if classes.is_empty() {
        format!("{last} addresses only")
    } else {
        format!("{} and {last} addresses", classes.join(", "))
    }
}

#[derive(Serialize)]
struct PolicyJson {
    destinations: String,
    loopback: bool,
    private: bool,
    link_local: bool,
}

impl PolicyJson {
    fn of(p: AddressPolicy) -> PolicyJson {
        PolicyJson {
            destinations: policy_name(p),
            loopback: p.allow_loopback,
            private: p.allow_private,
            link_local: p.allow_link_local,
        }
    }
}

#[derive(Serialize)]
struct SetJson {
    #[serde(flatten)]
    policy: PolicyJson,
    before: String,
    changed: bool,
}

pub(crate) async fn cmd_destinations(
    backend: &Backend,
    args: DestinationsArgs,
) -> anyhow::Result<()> {
    let (set, json) = match args.action {
        None => (None, args.json),
        Some(DestinationsAction::Show { json }) => (None, json || args.json),
        Some(DestinationsAction::Set { policy, json }) => (Some(policy), json || args.json),
    };
    let Some(arg) = set else {
        let p = backend.destination_policy().await?;
        return if json {
            print_json(&PolicyJson::of(p))
        } else {
            print(&format!(
                "destinations: {} ({})\n",
                policy_name(p),
                allows(p)
            ))
        };
    };
    let wanted = policy_of(arg);
    let change: PolicyChange = backend.set_destination_policy(wanted).await?;
    let (before, after) = (policy_name(change.before), policy_name(change.after));
    if !outbox_lanes_store::covers(change.after, change.before) {
        warn!(%before, %after,
            "narrowed the outbox's destination policy: units already enqueued for a \
             destination it now refuses are dead-lettered destination_refused at their next \
             attempt by every process whose own setting does not allow it (a WARN once per \
             lane); a process started with --allow-private-destinations, or a library outbox \
             allowing more, widens it again when it next starts");
    } else if change.changed() {
        info!(%before, %after, "widened the outbox's destination policy");
    }
    if json {
        print_json(&SetJson {
            policy: PolicyJson::of(change.after),
            before,
            changed: change.changed(),
        })
    } else if change.changed() {
        print(&format!(
            "destinations: {after} ({}; was {before})\n",
            allows(change.after)
        ))
    } else {
        print(&format!(
            "destinations: {after} ({}; unchanged)\n",
            allows(change.after)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_in_words() {
        assert_eq!(
            allows(policy_of(DestinationsArg::Public)),
            "public addresses only"
        );
        assert_eq!(
            allows(policy_of(DestinationsArg::Loopback)),
            "public and loopback addresses"
        );
        assert_eq!(
            allows(policy_of(DestinationsArg::Private)),
            "public, loopback and private-range addresses"
        );
    }
}
