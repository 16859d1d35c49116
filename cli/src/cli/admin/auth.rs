//! Who may act: the admin token, sessions and CSRF tokens.
//!
//! - Without `--admin-token-file` the dashboard is read-only: every action is refused (403)
//!   and no login form is offered.
//! - With it, an operator logs in once by typing the token (`POST /login`); it is compared
//!   in constant time (`subtle`) with the file's, and never written back into a page, a log
//!   line or a cookie. A login makes a session: a random 256-bit id in a cookie
//!   (`HttpOnly`, `SameSite=Strict`, `Path=/`, 12 h) and a random 256-bit CSRF token kept with
//!   it on the server.
//! - CSRF: every action is a POST whose form carries the session's CSRF token in a hidden
//!   field (the synchronizer-token pattern). A request is refused unless its session cookie
//!   names a live session *and* its form's token equals that session's (constant time). A
//!   page of another site can neither read the token (the same-origin policy) nor send the
//!   cookie (`SameSite=Strict`), so it cannot forge an action. Requests a browser marks
//!   `Sec-Fetch-Site: cross-site` or `same-site` are refused before anything else.
//! - Sessions live in this process's memory: a restart logs everybody out. At most
//!   [`MAX_SESSIONS`] are kept (the oldest goes first).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use subtle::ConstantTimeEq as _;

/// The session cookie's name.
pub(crate) const COOKIE: &str = "outbox_lanes_admin";
/// How long a session lives.
pub(crate) const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// Sessions kept at most.
const MAX_SESSIONS: usize = 1024;
/// The shortest token accepted in `--admin-token-file`.
pub(crate) const MIN_TOKEN: usize = 16;

#[derive(Debug)]
struct Session {
    csrf: String,
    expires: Instant,
}

/// The token and the sessions.
#[derive(Debug, Default)]
pub(crate) struct Auth {
    token: Option<Vec<u8>>,
    sessions: Mutex<HashMap<String, Session>>,
}

/// Why an action is refused (403), as the page says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// No `--admin-token-file`: read-only.
    ReadOnly,
    /// No live session: log in with the token.
    NoSession,
    /// The form's CSRF token is missing or wrong.
    Csrf,
    /// Sent by another site.
    CrossSite,
}

impl Refused {
    pub(crate) fn text(self) -> &'static str {
        match self {
            Refused::ReadOnly => {
                "the dashboard is read-only: the relay runs without --admin-token-file"
            }
            Refused::NoSession => "log in with the admin token first",
            Refused::Csrf => "the form's CSRF token is missing or wrong: reload the page",
            Refused::CrossSite => "refused: the request came from another site",
        }
    }
}

/// Reads the token of `--admin-token-file`: the file's text without surrounding whitespace,
/// at least [`MIN_TOKEN`] bytes.
pub(crate) fn read_token(path: &std::path::Path) -> Result<Vec<u8>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("--admin-token-file {}: {e}", path.display()))?;
    let token = text.trim();
    if token.len() < MIN_TOKEN {
        return Err(format!(
            "--admin-token-file {}: the token is shorter than {MIN_TOKEN} bytes",
            path.display()
        ));
    }
    Ok(token.as_bytes().to_vec())
}

/// `n` random bytes as hex.
fn random_hex(n: usize) -> String {
    let mut b = vec![0u8; n];
    getrandom::getrandom(&mut b).expect("the system's random source is available");
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.ct_eq(b).into()
}

impl Auth {
    pub(crate) fn new(token: Option<Vec<u8>>) -> Auth {
        Auth {
            token,
            sessions: Mutex::new(HashMap::new()),
        }
    }

    /// Whether actions can be allowed at all.
    pub(crate) fn enabled(&self) -> bool {
        self.token.is_some()
    }

    /// A new session for a login with `given`: `(session id, csrf)`, or `None` if the
    /// token is wrong (or there is none).
    pub(crate) fn login(&self, given: &str) -> Option<(String, String)> {
        let token = self.token.as_deref()?;
        if !ct_eq(token, given.trim().as_bytes()) {
            return None;
        }
        let (sid, csrf) = (random_hex(32), random_hex(32));
        let now = Instant::now();
        let mut s = self.sessions.lock().unwrap_or_else(PoisonError::into_inner);
        s.retain(|_, v| v.expires > now);
        while s.len() >= MAX_SESSIONS {
            let oldest = s
                .iter()
                .min_by_key(|(_, v)| v.expires)
                .map(|(k, _)| k.clone())
                .expect("not empty");
            s.remove(&oldest);
        }
        s.insert(
            sid.clone(),
            Session {
                csrf: csrf.clone(),
                expires: now + SESSION_TTL,
            },
        );
        Some((sid, csrf))
    }

    /// Ends the session of `headers`' cookie.
    pub(crate) fn logout(&self, headers: &HeaderMap) {
        if let Some(sid) = cookie(headers) {
            self.sessions
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&sid);
        }
    }

    /// The CSRF token of the live session named by `headers`' cookie.
    pub(crate) fn csrf(&self, headers: &HeaderMap) -> Option<String> {
        self.token.as_ref()?;
        let sid = cookie(headers)?;
        let s = self.sessions.lock().unwrap_or_else(PoisonError::into_inner);
        s.get(&sid)
            .filter(|v| v.expires > Instant::now())
            .map(|v| v.csrf.clone())
    }

    /// Whether a POST with `headers` and the form's `csrf` may act.
    pub(crate) fn authorize(&self, headers: &HeaderMap, csrf: &str) -> Result<(), Refused> {
        if !self.enabled() {
            return Err(Refused::ReadOnly);
        }
        cross_site(headers)?;
        let Some(want) = self.csrf(headers) else {
            return Err(Refused::NoSession);
        };
        if ct_eq(want.as_bytes(), csrf.as_bytes()) {
            Ok(())
        } else {
            Err(Refused::Csrf)
        }
    }
}

/// Refuses a request a browser says another site sent.
pub(crate) fn cross_site(headers: &HeaderMap) -> Result<(), Refused> {
    match headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()) {
        Some("cross-site" | "same-site") => Err(Refused::CrossSite),
        _ => Ok(()),
    }
}

/// The session id of the request's cookie.
fn cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|c| {
            let (k, v) = c.trim().split_once('=')?;
            (k == COOKIE).then(|| v.to_owned())
        })
}

/// The `Set-Cookie` value of a new session.
pub(crate) fn set_cookie(sid: &str) -> String {
    format!(
        "{COOKIE}={sid}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}",
        SESSION_TTL.as_secs()
    )
}

/// The `Set-Cookie` value that ends a session in the browser.
pub(crate) fn clear_cookie() -> String {
    format!("{COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_cookie(sid: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            axum::http::header::COOKIE,
            format!("a=b; {COOKIE}={sid}")
                .parse()
                .expect("a header value"),
        );
        h
    }

    #[test]
    fn actions_need_the_token_a_session_and_its_csrf_token() {
        let read_only = Auth::new(None);
        assert_eq!(read_only.login("x"), None);
        assert_eq!(
            read_only.authorize(&HeaderMap::new(), ""),
            Err(Refused::ReadOnly)
        );
        let a = Auth::new(Some(b"0123456789abcdef".to_vec()));
        assert_eq!(a.login("0123456789abcdeX"), None);
        assert_eq!(a.login("0123456789abcde"), None);
        let (sid, csrf) = a.login("0123456789abcdef\n").expect("the right token");
        assert_eq!(
            a.authorize(&HeaderMap::new(), &csrf),
            Err(Refused::NoSession)
        );
        let h = with_cookie(&sid);
        assert_eq!(a.authorize(&h, ""), Err(Refused::Csrf));
        assert_eq!(a.authorize(&h, &sid), Err(Refused::Csrf));
        assert_eq!(a.authorize(&h, &csrf), Ok(()));
        let mut cross = h.clone();
        cross.insert("sec-fetch-site", "cross-site".parse().expect("a value"));
        assert_eq!(a.authorize(&cross, &csrf), Err(Refused::CrossSite));
        a.logout(&h);
        assert_eq!(a.authorize(&h, &csrf), Err(Refused::NoSession));
    }
}
