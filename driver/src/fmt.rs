//! How logs and tables write times: RFC 3339 in UTC with milliseconds, the one format an
//! operator reads and a log pipeline parses alike (never raw epoch milliseconds).

use outbox_lanes_core::Timestamp;

/// `t` as RFC 3339 in UTC with milliseconds, e.g. `2026-12-02T00:21:03.512Z`.
pub fn rfc3339(t: Timestamp) -> String {
    humantime::format_rfc3339_millis(t.to_system_time()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millis_in_utc() {
        assert_eq!(
            rfc3339(Timestamp::from_millis(1_500)),
            "1970-01-01T00:00:01.500Z"
        );
    }
}
