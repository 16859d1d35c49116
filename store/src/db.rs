//! The statement layer shared by the backends: a statement is written once, with `$n`
//! placeholders, and runs on SQLite (rusqlite, or sqlx's) or Postgres (the `postgres` crate, or
//! sqlx's) through [`Db`]; its rows are read through [`Get`], whose every accessor returns a
//! typed error instead of panicking on a column of the wrong type.
//!
//! Where the dialects differ, a statement says so in one of two ways:
//!
//! - tokens, replaced once per dialect when the statement is first used: `{now}` (the
//!   database's clock in milliseconds) and `{lock}` (`FOR UPDATE` on Postgres, nothing on
//!   SQLite, whose single writer already serialises the transaction), `{empty_bytes}` (an
//!   empty blob literal);
//! - a second text for SQLite ([`Sql::with_sqlite`]) when the statement itself must differ
//!   (arrays, planner hints, `SKIP LOCKED`).
//!
//! Booleans are written `TRUE`/`FALSE` and `NOT x` (SQLite reads them as 1/0); casts are left
//! out. The hot path keeps its own tuned SQL per dialect (`sqlite_path.rs`, `pg_path.rs`,
//! `enqueue.rs`), written over this layer too (with arrays, which only Postgres binds and
//! reads: on SQLite they are an error, never a panic).
//!
//! Enqueue also runs on a caller's sqlx connection, from async code that must not block: it is
//! written over [`AsyncDb`], the same statements awaited. Every [`Db`] is an [`AsyncDb`] whose
//! futures are ready at once ([`ready`] takes their result without an executor); the sqlx
//! connections (`sqlx.rs`) are the only ones that really wait.
//!
//! Each driver's side of the layer lives with its store: rusqlite's in `sqlite.rs`, the
//! `postgres` crate's in `postgres.rs`, sqlx's in `sqlx.rs`. Why no query builder: it would
//! hide the hand-tuned statements this layer exists to share.

use core::future::Future;
use core::pin::pin;
use core::task::{Context, Poll, Waker};
use std::sync::OnceLock;

use crate::StoreError;

/// Which database a statement runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
// A build with one database names only its own dialect.
#[cfg_attr(
    not(all(feature = "sqlite", any(feature = "postgres", feature = "sqlx"))),
    allow(dead_code)
)]
pub(crate) enum Dialect {
    /// rusqlite.
    Sqlite,
    /// postgres.
    Postgres,
}

impl Dialect {
    /// The database's clock in Unix milliseconds, as an SQL expression.
    fn now(self) -> &'static str {
        match self {
            Dialect::Sqlite => "CAST(unixepoch('subsec') * 1000 AS INTEGER)",
            Dialect::Postgres => "(extract(epoch from clock_timestamp()) * 1000)::bigint",
        }
    }

    fn empty_bytes(self) -> &'static str {
        match self {
            Dialect::Sqlite => "x''",
            Dialect::Postgres => "''::bytea",
        }
    }

    fn lock(self) -> &'static str {
        match self {
            Dialect::Sqlite => "",
            Dialect::Postgres => "FOR UPDATE",
        }
    }
}

/// One SQL statement, written once for both dialects (see the module docs). Declared as a
/// `static`: the text adapted to each dialect is made once and kept.
#[derive(Debug)]
pub(crate) struct Sql {
    text: &'static str,
    sqlite: Option<&'static str>,
    adapted: [OnceLock<String>; 2],
}

impl Sql {
    /// A statement whose text serves both dialects.
    pub(crate) const fn new(text: &'static str) -> Sql {
        Sql {
            text,
            sqlite: None,
            adapted: [OnceLock::new(), OnceLock::new()],
        }
    }

    /// A statement whose SQLite text differs: `text` for Postgres, `sqlite` for SQLite (both
    /// with `$n` placeholders and the tokens).
    pub(crate) const fn with_sqlite(text: &'static str, sqlite: &'static str) -> Sql {
        Sql {
            text,
            sqlite: Some(sqlite),
            adapted: [OnceLock::new(), OnceLock::new()],
        }
    }

    /// The text to run on `dialect`.
    pub(crate) fn text(&self, dialect: Dialect) -> &str {
        let (slot, source) = match dialect {
            Dialect::Sqlite => (&self.adapted[0], self.sqlite.unwrap_or(self.text)),
            Dialect::Postgres => (&self.adapted[1], self.text),
        };
        slot.get_or_init(|| adapt(source, dialect))
    }
}

/// Replaces the tokens, and on SQLite the `$n` placeholders by `?n` (SQLite would number a
/// `$1` by its first appearance, not by its digits).
fn adapt(text: &str, dialect: Dialect) -> String {
    let text = text
        .replace("{now}", dialect.now())
        .replace("{lock}", dialect.lock())
        .replace("{empty_bytes}", dialect.empty_bytes());
    match dialect {
        Dialect::Postgres => text,
        Dialect::Sqlite => {
            let mut out = String::with_capacity(text.len());
            let mut chars = text.chars().peekable();
            let mut quoted = false;
            while let Some(c) = chars.next() {
                if c == '\'' {
                    quoted = !quoted;
                }
                if c == '$' && !quoted && chars.peek().is_some_and(char::is_ascii_digit) {
                    out.push('?');
                } else {
                    out.push(c);
                }
            }
            out
        }
    }
}

/// A value bound to a statement's placeholder.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Value<'a> {
    /// A 64-bit integer (every integer column is `BIGINT`).
    Int(i64),
    /// An integer or `NULL`.
    OptInt(Option<i64>),
    /// Text.
    Text(&'a str),
    /// Text or `NULL`.
    OptText(Option<&'a str>),
    /// Bytes (`BLOB`, `BYTEA`).
    Bytes(&'a [u8]),
    /// A boolean (an integer 0/1 on SQLite).
    Bool(bool),
    /// A `BIGINT[]` (Postgres only, like every array).
    Ints(&'a [i64]),
    /// A `BIGINT[]` with `NULL`s.
    OptInts(&'a [Option<i64>]),
    /// A `TEXT[]`.
    Texts(&'a [&'a str]),
    /// A `TEXT[]` with `NULL`s.
    OptTexts(&'a [Option<&'a str>]),
    /// A `BYTEA[]`.
    Byteses(&'a [&'a [u8]]),
}

/// `From` each bindable Rust type for its [`Value`], for [`args!`]: `type => variant`.
macro_rules! value_from {
    ($($t:ty => $variant:ident),* $(,)?) => {$(
        impl<'a, 'b: 'a> From<$t> for Value<'a> {
            fn from(v: $t) -> Self {
                Value::$variant(v)
            }
        }
    )*};
}

value_from!(
    i64 => Int,
    Option<i64> => OptInt,
    bool => Bool,
    &'a str => Text,
    &'a String => Text,
    Option<&'a str> => OptText,
    &'a [u8] => Bytes,
    &'a Vec<i64> => Ints,
    &'a Vec<Option<i64>> => OptInts,
    &'a Vec<&'b str> => Texts,
    &'a Vec<Option<&'b str>> => OptTexts,
    &'a Vec<&'b [u8]> => Byteses,
);

/// The values of a statement's placeholders, in order: `args![lane.0, reason]`.
macro_rules! args {
    ($($v:expr),* $(,)?) => {
        &[$($crate::db::Value::from($v)),*]
    };
}
pub(crate) use args;

/// One row of a result, read by column index. A column of another type, or a `NULL` where a
/// value is required, is an error ([`StoreError::Database`] naming the column), never a panic.
pub(crate) trait Get {
    /// An integer.
    fn int(&self, col: usize) -> Result<i64, StoreError>;
    /// An integer or `NULL`.
    fn opt_int(&self, col: usize) -> Result<Option<i64>, StoreError>;
    /// Text.
    fn text(&self, col: usize) -> Result<String, StoreError>;
    /// Text or `NULL`.
    fn opt_text(&self, col: usize) -> Result<Option<String>, StoreError>;
    /// A boolean (SQLite: an integer, non-zero is true).
    fn flag(&self, col: usize) -> Result<bool, StoreError>;
    /// A boolean or `NULL`.
    fn opt_flag(&self, col: usize) -> Result<Option<bool>, StoreError>;
    /// Bytes.
    fn bytes(&self, col: usize) -> Result<Vec<u8>, StoreError>;
    /// Bytes or `NULL`.
    #[cfg_attr(not(any(feature = "postgres", feature = "sqlx")), allow(dead_code))]
    fn opt_bytes(&self, col: usize) -> Result<Option<Vec<u8>>, StoreError>;
    /// A `BIGINT[]` or `NULL` (Postgres only, like every array).
    #[cfg_attr(not(any(feature = "postgres", feature = "sqlx")), allow(dead_code))]
    fn opt_ints(&self, col: usize) -> Result<Option<Vec<i64>>, StoreError>;
    /// A `TEXT[]` or `NULL`.
    #[cfg_attr(not(any(feature = "postgres", feature = "sqlx")), allow(dead_code))]
    fn opt_texts(&self, col: usize) -> Result<Option<Vec<String>>, StoreError>;
}

/// [`Get`] for a driver's row type: `$get` reads column `$c` of row `$r` as the accessor's
/// type, its error made the store's. With `arrays` the driver reads the arrays too (Postgres);
/// without, an array read is an error.
macro_rules! impl_get {
    ($row:ty, |$r:ident, $c:ident| $get:expr, arrays) => {
        impl $crate::db::Get for $row {
            $crate::db::impl_get!(@scalars $r $c $get);
            $crate::db::impl_get!(@each $r $c $get, opt_ints: Option<Vec<i64>>,
                opt_texts: Option<Vec<String>>);
        }
    };
    ($row:ty, |$r:ident, $c:ident| $get:expr) => {
        impl $crate::db::Get for $row {
            $crate::db::impl_get!(@scalars $r $c $get);
            fn opt_ints(&self, _: usize) -> Result<Option<Vec<i64>>, $crate::StoreError> {
                Err($crate::StoreError::Database(
                    "an array read without arrays (they are Postgres only)".into(),
                ))
            }
            fn opt_texts(&self, _: usize) -> Result<Option<Vec<String>>, $crate::StoreError> {
                Err($crate::StoreError::Database(
                    "an array read without arrays (they are Postgres only)".into(),
                ))
            }
        }
    };
    (@scalars $r:ident $c:ident $get:expr) => {
        $crate::db::impl_get!(@each $r $c $get, int: i64, opt_int: Option<i64>, text: String,
            opt_text: Option<String>, flag: bool, opt_flag: Option<bool>, bytes: Vec<u8>,
            opt_bytes: Option<Vec<u8>>);
    };
    (@each $r:ident $c:ident $get:expr, $($name:ident: $t:ty),*) => {$(
        fn $name(&self, col: usize) -> Result<$t, $crate::StoreError> {
            let ($r, $c) = (self, col);
            $get
        }
    )*};
}
pub(crate) use impl_get;

/// A connection or transaction of either backend, running [`Sql`] statements and blocking
/// until each is done.
pub(crate) trait Db {
    /// The dialect of this connection.
    const DIALECT: Dialect;

    /// Runs statements without parameters, separated by `;` (the schema's DDL).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    fn batch(&mut self, sql: &str) -> Result<(), StoreError>;

    /// Runs a statement that returns no rows; returns how many rows it changed.
    fn execute(&mut self, sql: &Sql, args: &[Value<'_>]) -> Result<u64, StoreError>;

    /// Runs an `INSERT` of one row and returns its new `id` (`None`: nothing inserted): on
    /// Postgres the statement ends with `RETURNING id`, on SQLite it does not (its text of
    /// [`Sql::with_sqlite`]) and the id is the connection's last rowid, which spares SQLite the
    /// temporary table a `RETURNING` costs it.
    fn insert(&mut self, sql: &Sql, args: &[Value<'_>]) -> Result<Option<i64>, StoreError>;

    /// Runs a query and maps every row.
    fn query<T>(
        &mut self,
        sql: &Sql,
        args: &[Value<'_>],
        map: impl FnMut(&dyn Get) -> Result<T, StoreError>,
    ) -> Result<Vec<T>, StoreError>;

    /// The first row, if any.
    fn query_opt<T>(
        &mut self,
        sql: &Sql,
        args: &[Value<'_>],
        map: impl FnMut(&dyn Get) -> Result<T, StoreError>,
    ) -> Result<Option<T>, StoreError> {
        Ok(self.query(sql, args, map)?.into_iter().next())
    }

    /// The one row a statement always returns (an aggregate, or `RETURNING` of a row the same
    /// transaction wrote); none means the tables were edited by hand.
    fn query_one<T>(
        &mut self,
        sql: &Sql,
        args: &[Value<'_>],
        map: impl FnMut(&dyn Get) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.query_opt(sql, args, map)?.ok_or_else(|| {
            StoreError::Database(format!("no row returned by: {}", sql.text(Self::DIALECT)))
        })
    }
}

/// [`Db`]'s statements as futures: what enqueue is written on (see the module docs). Every
/// [`Db`] is one, ready at once; a caller's sqlx connection waits on its socket.
pub(crate) trait AsyncDb {
    /// The dialect of this connection.
    fn dialect(&self) -> Dialect;

    /// Whether this connection binds and reads arrays: on Postgres, but through sqlx's `Any`
    /// (which binds scalars only).
    fn arrays(&self) -> bool {
        self.dialect() == Dialect::Postgres
    }

    /// [`Db::execute`].
    fn execute(
        &mut self,
        sql: &'static Sql,
        args: &[Value<'_>],
    ) -> impl Future<Output = Result<u64, StoreError>>;

    /// [`Db::insert`].
    fn insert(
        &mut self,
        sql: &'static Sql,
        args: &[Value<'_>],
    ) -> impl Future<Output = Result<Option<i64>, StoreError>>;

    /// [`Db::query`].
    fn query<T, F: FnMut(&dyn Get) -> Result<T, StoreError>>(
        &mut self,
        sql: &'static Sql,
        args: &[Value<'_>],
        map: F,
    ) -> impl Future<Output = Result<Vec<T>, StoreError>>;

    /// [`Db::query_opt`].
    async fn query_opt<T, F: FnMut(&dyn Get) -> Result<T, StoreError>>(
        &mut self,
        sql: &'static Sql,
        args: &[Value<'_>],
        map: F,
    ) -> Result<Option<T>, StoreError> {
        Ok(self.query(sql, args, map).await?.into_iter().next())
    }

    /// [`Db::query_one`].
    async fn query_one<T, F: FnMut(&dyn Get) -> Result<T, StoreError>>(
        &mut self,
        sql: &'static Sql,
        args: &[Value<'_>],
        map: F,
    ) -> Result<T, StoreError> {
        let dialect = self.dialect();
        self.query_opt(sql, args, map).await?.ok_or_else(|| {
            StoreError::Database(format!("no row returned by: {}", sql.text(dialect)))
        })
    }
}

impl<D: Db> AsyncDb for D {
    fn dialect(&self) -> Dialect {
        D::DIALECT
    }

    fn execute(
        &mut self,
        sql: &'static Sql,
        args: &[Value<'_>],
    ) -> impl Future<Output = Result<u64, StoreError>> {
        core::future::ready(Db::execute(self, sql, args))
    }

    fn insert(
        &mut self,
        sql: &'static Sql,
        args: &[Value<'_>],
    ) -> impl Future<Output = Result<Option<i64>, StoreError>> {
        core::future::ready(Db::insert(self, sql, args))
    }

    fn query<T, F: FnMut(&dyn Get) -> Result<T, StoreError>>(
        &mut self,
        sql: &'static Sql,
        args: &[Value<'_>],
        map: F,
    ) -> impl Future<Output = Result<Vec<T>, StoreError>> {
        core::future::ready(Db::query(self, sql, args, map))
    }
}

/// The result of `f`, statements of a [`Db`] awaited: each is ready at once, so one poll
/// (without an executor) finishes it.
pub(crate) fn ready<T, E: From<StoreError>>(f: impl Future<Output = Result<T, E>>) -> Result<T, E> {
    match pin!(f).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => Err(StoreError::Database(
            "a blocking connection's statement did not complete at once".into(),
        )
        .into()),
    }
}

#[cfg(test)]
mod tests {
    use super::{Dialect, Sql, adapt};

    #[test]
    fn placeholders_become_numbered_question_marks_on_sqlite_only() {
        let s = Sql::new("SELECT '$1', x FROM t WHERE a = $1 AND b = $12 AND c < {now} {lock}");
        assert_eq!(
            s.text(Dialect::Sqlite),
            "SELECT '$1', x FROM t WHERE a = ?1 AND b = ?12 AND c < CAST(unixepoch('subsec') * 1000 AS INTEGER) "
        );
        assert_eq!(
            s.text(Dialect::Postgres),
            "SELECT '$1', x FROM t WHERE a = $1 AND b = $12 AND c < \
             (extract(epoch from clock_timestamp()) * 1000)::bigint FOR UPDATE"
        );
    }

    #[test]
    fn a_statement_may_carry_its_own_sqlite_text() {
        let s = Sql::with_sqlite("SELECT $1 OFFSET 0", "SELECT +$1");
        assert_eq!(s.text(Dialect::Postgres), "SELECT $1 OFFSET 0");
        assert_eq!(s.text(Dialect::Sqlite), "SELECT +?1");
        assert_eq!(adapt("$x", Dialect::Sqlite), "$x");
    }
}
