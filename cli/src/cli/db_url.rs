//! The `--db` URL: which store it names, the secrets it may carry, and how it is shown with
//! them masked (in errors, logs and what a command prints, and before an
//! `--on-dead-letter` command's environment is passed on).

/// Whether `db` names a Postgres database rather than a SQLite file.
pub(crate) fn is_postgres(db: &str) -> bool {
    db.starts_with("postgres://") || db.starts_with("postgresql://")
}

/// The secrets a Postgres URL carries, each as its text in the URL and as that text masked:
/// the password of `user:password@`, and the value of every query parameter whose name says
/// it is one (`password`, `sslpassword`, …). Longest first, so that one is never masked in
/// part by a shorter one. None for a SQLite path.
pub(crate) fn db_url_secrets(url: &str) -> Vec<(String, String)> {
    let mut secrets = Vec::new();
    if !is_postgres(url) {
        return secrets;
    }
    let authority = url.find("://").map_or(0, |i| i + 3);
    let (before_query, query) = url.split_once('?').unwrap_or((url, ""));
    if let Some(at) = before_query.rfind('@').filter(|&at| at >= authority) {
        let userinfo = &url[authority..at];
        if let Some((user, password)) = userinfo.split_once(':') {
            if !password.is_empty() {
                secrets.push((format!("{userinfo}@"), format!("{user}:***@")));
            }
        }
    }
    let query = query.split('#').next().unwrap_or("");
    for pair in query.split('&') {
        if let Some((name, value)) = pair.split_once('=') {
            let lower = name.to_ascii_lowercase();
            let secret = ["password", "passwd", "secret", "token"]
                .iter()
                .any(|s| lower.contains(s));
            if secret && !value.is_empty() {
                secrets.push((pair.to_owned(), format!("{name}=***")));
            }
        }
    }
    secrets.sort_by_key(|(text, _)| std::cmp::Reverse(text.len()));
    secrets
}

/// `--db` as it may be shown: a Postgres URL with its secrets masked.
pub(crate) fn redact_db(db: &str) -> String {
    mask_db_url_secrets(db, &db_url_secrets(db))
}

/// `text` with each secret of [`db_url_secrets`] masked.
pub(crate) fn mask_db_url_secrets(text: &str, secrets: &[(String, String)]) -> String {
    let mut text = text.to_owned();
    for (secret, masked) in secrets {
        text = text.replace(secret.as_str(), masked);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_password_of_a_database_url_is_masked() {
        let url = "postgres://me:pw%40x@db.example:5432/outbox?sslmode=require&password=hunter2\
                   &sslpassword=hunter3&application_name=x#frag";
        let masked = mask_db_url_secrets(url, &db_url_secrets(url));
        assert_eq!(
            masked,
            "postgres://me:***@db.example:5432/outbox?sslmode=require&password=***\
             &sslpassword=***&application_name=x#frag"
        );
        // As the store words it (userinfo already masked), in a sentence.
        let text = "cannot open database postgres://me:***@db.example:5432/outbox?password=hunter2: refused";
        assert_eq!(
            mask_db_url_secrets(text, &db_url_secrets(url)),
            "cannot open database postgres://me:***@db.example:5432/outbox?password=***: refused"
        );
        // A longer value is not left in part by a shorter one.
        let url = "postgres://h/db?password=ab&passwd=abc";
        assert_eq!(
            mask_db_url_secrets(url, &db_url_secrets(url)),
            "postgres://h/db?password=***&passwd=***"
        );
        for clean in [
            "postgres://me@h/db?sslmode=disable",
            "./outbox.db",
            "x.db?password=y",
        ] {
            assert!(db_url_secrets(clean).is_empty(), "{clean}");
        }
    }
}
