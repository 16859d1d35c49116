//! [`NewRow`], a row to enqueue, and its builder.

/// A row to enqueue.
///
/// Build it with its methods, the preferred form: [`NewRow::activity`] (an ActivityPub
/// activity from any `serde::Serialize` value, `application/activity+json`), [`NewRow::json`]
/// (`application/json`) or [`NewRow::new`] and [`NewRow::body`] for other bytes, then
/// [`recipients`](NewRow::recipients) from any iterator of string-likes, and
/// [`dedup_key`](NewRow::dedup_key), [`ordering_key`](NewRow::ordering_key),
/// [`joined`](NewRow::joined) or [`header`](NewRow::header) where needed:
///
/// ```
/// # #[cfg(feature = "json")] {
/// use outbox_lanes_store::NewRow;
///
/// let activity = serde_json::json!({
///     "@context": "https://www.w3.org/ns/activitystreams",
///     "type": "Create",
///     "actor": "https://example.com/users/alice",
/// });
/// let inboxes = ["https://b.example/inbox", "https://c.example/inbox"];
/// let row = NewRow::activity("https://example.com/activities/1", &activity)?
///     .recipients(inboxes)
///     .recipient("https://d.example/users/dana/inbox");
/// assert_eq!(row.content_type, "application/activity+json");
/// assert_eq!(row.recipients.len(), 3);
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// The fields stay public, so a struct literal works too: [`NewRow::default`] is a JSON row
/// (`application/json`) with nothing else set (give it an id, a body and recipients).
/// Nothing is checked until enqueue, which refuses a bad row with an error naming it (OL-4).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewRow {
    /// Unique within the actor; a duplicate is refused.
    pub id: String,
    /// The payload, stored once per row.
    pub body: Vec<u8>,
    /// Its content type, sent as `Content-Type`: not empty. Default `application/json`.
    pub content_type: String,
    /// Inbox URLs; canonicalised, duplicates collapse to one lane (OL-19).
    pub recipients: Vec<String>,
    /// Dedup key (OL-17).
    pub dedup_key: Option<String>,
    /// Narrows each lane to (recipient, key) (OL-19). An empty key means none.
    pub ordering_key: Option<String>,
    /// One unit occupying every lane at once, instead of one unit per recipient.
    pub joined: bool,
    /// Extra request headers (name, value) sent with every delivery of the row, in this order.
    ///
    /// Names are HTTP tokens, at most once each (case-insensitively); values are visible
    /// ASCII, spaces and tabs, without leading or trailing whitespace; at most
    /// [`MAX_HEADERS`](crate::MAX_HEADERS) of them and
    /// [`MAX_HEADER_BYTES`](crate::MAX_HEADER_BYTES) of names and values. The headers the
    /// client or the signer sets and hop-by-hop ones are refused (see [`RESERVED_HEADERS`](crate::RESERVED_HEADERS)):
    /// `Content-Type` is [`NewRow::content_type`]. Empty (the default) stores nothing.
    pub headers: Vec<(String, String)>,
}

impl Default for NewRow {
    fn default() -> Self {
        NewRow {
            id: String::new(),
            body: Vec::new(),
            content_type: "application/json".to_owned(),
            recipients: Vec::new(),
            dedup_key: None,
            ordering_key: None,
            joined: false,
            headers: Vec::new(),
        }
    }
}

/// The content type of an ActivityPub activity, as [`NewRow::activity`] sets it.
pub const ACTIVITY_JSON: &str = "application/activity+json";

impl NewRow {
    /// A row with this id (unique within the actor) and nothing else: an empty body,
    /// `application/json`, no recipients. Give it a [`body`](NewRow::body) and
    /// [`recipients`](NewRow::recipients).
    pub fn new(id: impl Into<String>) -> NewRow {
        NewRow {
            id: id.into(),
            ..NewRow::default()
        }
    }

    /// A row whose body is `value` serialized as JSON, sent as `application/json`.
    ///
    /// # Errors
    /// `value`'s `Serialize` failed (a map whose keys are not strings, a custom
    /// implementation's error); nothing is built.
    #[cfg(feature = "json")]
    pub fn json<T: serde::Serialize + ?Sized>(
        id: impl Into<String>,
        value: &T,
    ) -> Result<NewRow, serde_json::Error> {
        Ok(NewRow::new(id).body(serde_json::to_vec(value)?))
    }

    /// An ActivityPub activity: `value` serialized as JSON, sent as
    /// `application/activity+json` ([`ACTIVITY_JSON`]).
    ///
    /// The recipients are inboxes (an actor's `inbox` or a server's `sharedInbox`), not the
    /// actor ids of the activity's `to` and `cc`: give them with
    /// [`recipients`](NewRow::recipients).
    ///
    /// # Errors
    /// As [`NewRow::json`].
    #[cfg(feature = "json")]
    pub fn activity<T: serde::Serialize + ?Sized>(
        id: impl Into<String>,
        value: &T,
    ) -> Result<NewRow, serde_json::Error> {
        Ok(NewRow::json(id, value)?.content_type(ACTIVITY_JSON))
    }

    /// Sets the body: the bytes POSTed, stored once per row.
    #[must_use]
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> NewRow {
        self.body = body.into();
        self
    }

    /// Sets the content type, sent as `Content-Type` (not empty).
    #[must_use]
    pub fn content_type(mut self, content_type: impl Into<String>) -> NewRow {
        self.content_type = content_type.into();
        self
    }

    /// Adds one recipient (an inbox URL).
    #[must_use]
    pub fn recipient(mut self, url: impl Into<String>) -> NewRow {
        self.recipients.push(url.into());
        self
    }

    /// Adds recipients from any iterator of string-likes: `&[&str]`, `Vec<String>`,
    /// `&Vec<String>`, an iterator of `&String`…
    #[must_use]
    pub fn recipients<I>(mut self, urls: I) -> NewRow
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        self.recipients.extend(urls.into_iter().map(Into::into));
        self
    }

    /// Sets the dedup key (OL-17).
    #[must_use]
    pub fn dedup_key(mut self, key: impl Into<String>) -> NewRow {
        self.dedup_key = Some(key.into());
        self
    }

    /// Sets the ordering key: each lane is narrowed to (recipient, key) (OL-19).
    #[must_use]
    pub fn ordering_key(mut self, key: impl Into<String>) -> NewRow {
        self.ordering_key = Some(key.into());
        self
    }

    /// One unit occupying every recipient's lane at once, instead of one unit per recipient
    /// (OL-20).
    #[must_use]
    pub fn joined(mut self) -> NewRow {
        self.joined = true;
        self
    }

    /// Adds a request header sent with every delivery of the row (see [`NewRow::headers`]
    /// for the names and values enqueue accepts).
    #[must_use]
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> NewRow {
        self.headers.push((name.into(), value.into()));
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_is_the_default_row_with_its_id() {
        let row = NewRow::new("r1");
        assert_eq!(
            row,
            NewRow {
                id: "r1".into(),
                ..NewRow::default()
            }
        );
        assert_eq!(row.content_type, "application/json");
    }

    #[test]
    fn each_setter_sets_its_field() {
        let row = NewRow::new("r1")
            .body(b"hello".as_slice())
            .content_type("text/plain")
            .recipient("https://a.example/inbox")
            .dedup_key("d")
            .ordering_key("o")
            .joined()
            .header("Authorization", "Bearer t")
            .header("X-Trace", "1");
        assert_eq!(
            row,
            NewRow {
                id: "r1".into(),
                body: b"hello".to_vec(),
                content_type: "text/plain".into(),
                recipients: vec!["https://a.example/inbox".into()],
                dedup_key: Some("d".into()),
                ordering_key: Some("o".into()),
                joined: true,
                headers: vec![
                    ("Authorization".into(), "Bearer t".into()),
                    ("X-Trace".into(), "1".into()),
                ],
            }
        );
        // The body from an owned Vec and a String, too.
        assert_eq!(NewRow::new("r").body(vec![1, 2]).body, [1, 2]);
        assert_eq!(NewRow::new("r").body(String::from("x")).body, b"x");
    }

    #[test]
    fn recipients_come_from_any_iterator_of_string_likes_and_add_up() {
        let owned = vec![String::from("https://b.example/inbox")];
        let row = NewRow::new("r")
            .recipients(["https://a.example/inbox"])
            .recipients(&owned)
            .recipients(owned.iter().map(|u| format!("{u}?x")))
            .recipients(owned.clone())
            .recipient("https://c.example/inbox");
        assert_eq!(
            row.recipients,
            [
                "https://a.example/inbox",
                "https://b.example/inbox",
                "https://b.example/inbox?x",
                "https://b.example/inbox",
                "https://c.example/inbox",
            ]
        );
        let none: [&str; 0] = [];
        assert!(NewRow::new("r").recipients(none).recipients.is_empty());
    }

    #[cfg(feature = "json")]
    #[test]
    fn json_and_activity_serialize_the_value_with_their_content_type() {
        let value = serde_json::json!({"type": "Create", "object": {"content": "hi"}});
        let row = NewRow::json("r", &value).expect("serializes");
        assert_eq!(row.content_type, "application/json");
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&row.body).expect("JSON"),
            value
        );
        let row = NewRow::activity("r", &value).expect("serializes");
        assert_eq!(row.content_type, ACTIVITY_JSON);
        assert_eq!(row.content_type, "application/activity+json");
        assert_eq!(row.body, serde_json::to_vec(&value).expect("serializes"));
        assert!(row.recipients.is_empty(), "no recipient is guessed");
        // Any Serialize value, unsized included.
        let row = NewRow::json("r", "text").expect("serializes");
        assert_eq!(row.body, br#""text""#);
    }

    #[cfg(feature = "json")]
    #[test]
    fn a_value_that_does_not_serialize_is_an_error() {
        // JSON object keys are strings: a map keyed by pairs has no JSON form.
        let value = std::collections::BTreeMap::from([((1, 2), "x")]);
        let e = NewRow::json("r", &value).expect_err("keys are not strings");
        assert!(e.to_string().contains("key must be a string"), "{e}");
        let e = NewRow::activity("r", &value).expect_err("keys are not strings");
        assert!(e.to_string().contains("key must be a string"), "{e}");
    }
}
