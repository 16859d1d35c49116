//! What every runtime's `OutboxBuilder` gathers before it opens an outbox, and the one way
//! an outbox opens from it: the double-knock's plan derived from the signer
//! ([`OutboxConfig::sign_with`]), the core started on the runtime ([`OutboxCore::new`]),
//! and a store let go where blocking is allowed should the core not start. A runtime's
//! builder adds only what is its own (its executor, its HTTP client) and its setters come
//! from [`outbox_builder_setters!`](crate::outbox_builder_setters), so both runtimes offer
//! the same ones with the same docs.

use std::fmt;
use std::sync::Arc;

use outbox_lanes_core::{ActorResolver, IdentityResolver};
use outbox_lanes_store::Store;

use crate::engine::{self, Runtime};
use crate::sign::Signer;
use crate::{Executor, Hooks, OutboxConfig, OutboxCore, OutboxError};

/// The options of an outbox to open: its store and configuration, the actor resolver,
/// hooks and signer.
pub struct OutboxOptions {
    store: Arc<dyn Store>,
    config: OutboxConfig,
    /// Maps actor aliases to canonical ids (the identity by default).
    pub resolver: Box<dyn ActorResolver + Send + Sync>,
    /// Delivery hooks (none by default).
    pub hooks: Hooks,
    /// Signs every attempt (nothing by default).
    pub signer: Option<Arc<dyn Signer>>,
}

impl fmt::Debug for OutboxOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutboxOptions")
            .field("config", &self.config)
            .field("signed", &self.signer.is_some())
            .finish_non_exhaustive()
    }
}

impl OutboxOptions {
    /// An outbox over `store` with `config`, the identity resolver, no hooks, no signer.
    pub fn new(store: Arc<dyn Store>, config: OutboxConfig) -> OutboxOptions {
        OutboxOptions {
            store,
            config,
            resolver: Box::new(IdentityResolver),
            hooks: Hooks::default(),
            signer: None,
        }
    }

    /// The configuration (the HTTP client and the executor are built from it).
    pub fn config(&self) -> &OutboxConfig {
        &self.config
    }

    /// Opens the outbox's core on `rt`, delivering through `executor`.
    ///
    /// # Errors
    /// A thread of the core could not be started, or the store refused the outbox's
    /// destination policy ([`OutboxCore::new`]).
    pub fn open(
        self,
        rt: &dyn Runtime,
        executor: Arc<dyn Executor>,
    ) -> Result<OutboxCore, OutboxError> {
        let mut config = self.config;
        config.sign_with(self.signer.as_deref());
        // A core that cannot start lets its store go, and the last reference to a `PgStore`
        // panics when dropped on an executor thread (where an async runtime opens): that
        // one is let go where blocking is allowed.
        let kept = Arc::clone(&self.store);
        let opened = OutboxCore::new(rt, self.store, config, self.resolver, self.hooks, executor);
        if opened.is_err() {
            engine::drop_where_blocking(rt, kept);
        }
        opened
    }
}

/// The setters every runtime's `OutboxBuilder` has, over its field `options`
/// ([`OutboxOptions`]): `resolver`, `hooks` and `signer`.
#[macro_export]
#[doc(hidden)]
macro_rules! outbox_builder_setters {
    () => {
        /// Maps actor aliases to canonical ids (two spellings of one actor share one slot).
        pub fn resolver(
            mut self,
            r: impl $crate::core::ActorResolver + Send + Sync + 'static,
        ) -> Self {
            self.options.resolver = Box::new(r);
            self
        }

        /// Delivery hooks. They are called from the pass (where blocking is allowed, or on
        /// an executor thread for `attempted`): keep them short, and do not block on an
        /// async runtime in them.
        pub fn hooks(mut self, hooks: $crate::Hooks) -> Self {
            self.options.hooks = hooks;
            self
        }

        /// Signs every attempt: a signer by value (`HttpSignatures`, `StandardWebhooks`,
        /// `WebhookSecrets`…) or shared in an `Arc`
        /// ([`IntoSigner`]($crate::sign::IntoSigner)).
        pub fn signer(mut self, signer: impl $crate::sign::IntoSigner) -> Self {
            self.options.signer = Some($crate::sign::IntoSigner::into_signer(signer));
            self
        }
    };
}
