//! `relay --admin-addr`: the web dashboard in a real browser (headless Chromium driven through
//! WebDriver by chromedriver, both from the distribution's packages).
//!
//! A relay delivers to loopback recipients (one answering 500 with a `<script>` in its body,
//! one hanging, one answering 200, one refusing with 422 a row that carries an
//! `Authorization` header); the pages render that data; the script shows as text and never
//! runs; the credential is masked; an action without the token is refused and changes
//! nothing; a click on "Pause" after logging in with the token pauses the lane, as
//! `lanes --json` through the binary then shows.
//!
//! Without chromium and chromedriver the test says so and passes, unless `CI` is set (then it
//! fails). `OUTBOX_LANES_SCREENSHOTS=DIR` writes the main pages as PNG files into DIR (the
//! operator guide's `docs/dashboard-*.png`).

#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine as _;
use common::{Db, Relay, eventually, free_port, get};
use outbox_lanes_test_support::{Recipient, Reply, Response};
use serde_json::{Value, json};

const TOKEN: &str = "dashboard-test-token-0123456789";
const SECRET_HEADER: &str = "Bearer t0k3n-do-not-show-me";
const SCRIPT: &str = "<script>alert(1)</script>";

/// `name` on the PATH, or the first of `paths` that exists.
fn find(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for name in names {
        for dir in std::env::split_paths(&path) {
            let p = dir.join(name);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    None
}

/// chromedriver on a free loopback port, killed when dropped.
struct Driver {
    child: Child,
    base: String,
    _profile: tempfile::TempDir,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One browser session.
struct Browser {
    /// Whether [`Browser::screenshot`] takes them.
    screenshots: bool,
    agent: ureq::Agent,
    session: String,
    driver: Driver,
}

impl Browser {
    fn start(chromium: &std::path::Path, chromedriver: &std::path::Path) -> Browser {
        let port = free_port();
        let child = Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let profile = tempfile::tempdir().unwrap();
        let driver = Driver {
            child,
            base: format!("http://127.0.0.1:{port}"),
            _profile: profile,
        };
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(60)))
            .build()
            .into();
        assert!(
            eventually(|| agent.get(format!("{}/status", driver.base)).call().is_ok()),
            "chromedriver did not answer"
        );
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium.to_string_lossy(),
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                    "--disable-dev-shm-usage", "--window-size=1280,1100",
                    format!("--user-data-dir={}", driver._profile.path().display())],
            },
        }}});
        let mut b = Browser {
            screenshots: false,
            agent,
            session: String::new(),
            driver,
        };
        let v = b.call("POST", "/session", Some(caps));
        b.session = v["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {v}"))
            .to_owned();
        b
    }

    /// A WebDriver command: its `value`, or the error's JSON as `Err`.
    fn try_call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, Value> {
        let url = format!("{}{path}", self.driver.base);
        let resp = match (method, body) {
            ("GET", _) => self.agent.get(&url).call(),
            ("DELETE", _) => self.agent.delete(&url).call(),
            (_, body) => self
                .agent
                .post(&url)
                .content_type("application/json")
                .send(body.unwrap_or_else(|| json!({})).to_string()),
        };
        let mut resp = resp.unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let ok = resp.status().is_success();
        let text = resp.body_mut().read_to_string().unwrap();
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        if ok { Ok(v["value"].clone()) } else { Err(v) }
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        self.try_call(method, path, body)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    fn s(&self, rest: &str) -> String {
        format!("/session/{}{rest}", self.session)
    }

    fn goto(&self, url: &str) {
        self.call("POST", &self.s("/url"), Some(json!({ "url": url })));
    }

    fn source(&self) -> String {
        self.call("GET", &self.s("/source"), None)
            .as_str()
            .unwrap()
            .to_owned()
    }

    fn find(&self, css: &str) -> Option<String> {
        let v = self
            .try_call(
                "POST",
                &self.s("/element"),
                Some(json!({"using": "css selector", "value": css})),
            )
            .ok()?;
        v.as_object()?.values().next()?.as_str().map(str::to_owned)
    }

    fn element(&self, css: &str) -> String {
        self.find(css)
            .unwrap_or_else(|| panic!("no element {css} in:\n{}", self.source()))
    }

    fn text(&self, css: &str) -> String {
        let e = self.element(css);
        self.call("GET", &self.s(&format!("/element/{e}/text")), None)
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// The text of `css`, or `None` if it is not there (or went with a page navigated away).
    fn try_text(&self, css: &str) -> Option<String> {
        let e = self.find(css)?;
        self.try_call("GET", &self.s(&format!("/element/{e}/text")), None)
            .ok()?
            .as_str()
            .map(str::to_owned)
    }

    fn click(&self, css: &str) {
        let e = self.element(css);
        self.call("POST", &self.s(&format!("/element/{e}/click")), None);
    }

    fn type_into(&self, css: &str, text: &str) {
        let e = self.element(css);
        self.call(
            "POST",
            &self.s(&format!("/element/{e}/value")),
            Some(json!({ "text": text })),
        );
    }

    fn script(&self, js: &str) -> Value {
        self.call(
            "POST",
            &self.s("/execute/sync"),
            Some(json!({"script": js, "args": []})),
        )
    }

    /// No alert is open (a script of the page that ran `alert(1)` would have left one).
    fn no_alert(&self) {
        if let Ok(text) = self.try_call("GET", &self.s("/alert/text"), None) {
            panic!("an alert is open: {text}");
        }
    }

    fn screenshot(&self, name: &str) {
        let Some(dir) = std::env::var_os("OUTBOX_LANES_SCREENSHOTS").filter(|_| self.screenshots)
        else {
            return;
        };
        let b64 = self.call("GET", &self.s("/screenshot"), None);
        let png = base64::engine::general_purpose::STANDARD
            .decode(b64.as_str().unwrap())
            .unwrap();
        std::fs::write(
            PathBuf::from(dir).join(format!("dashboard-{name}.png")),
            png,
        )
        .unwrap();
    }

    fn cookies(&self) -> Vec<Value> {
        self.call("GET", &self.s("/cookie"), None)
            .as_array()
            .cloned()
            .unwrap_or_default()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = self.try_call("DELETE", &self.s(""), None);
        }
    }
}

/// A POST of a form to the dashboard, outside the browser: (status, body).
fn post_form(port: u16, path: &str, form: &[(&str, &str)], cookie: Option<&str>) -> (u16, String) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .build()
        .into();
    let body: Vec<String> = form
        .iter()
        .map(|(k, v)| format!("{k}={}", enc(v)))
        .collect();
    let mut req = agent
        .post(format!("http://127.0.0.1:{port}{path}"))
        .content_type("application/x-www-form-urlencoded");
    if let Some(c) = cookie {
        req = req.header("Cookie", c);
    }
    let mut resp = req.send(body.join("&")).unwrap();
    let code = resp.status().as_u16();
    (code, resp.body_mut().read_to_string().unwrap_or_default())
}

/// `GET path` of the dashboard, outside the browser, with `Host` as given: (status, body).
fn page_as(port: u16, path: &str, host: &str) -> (u16, String) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let mut resp = agent
        .get(format!("http://127.0.0.1:{port}{path}"))
        .header("Host", host)
        .call()
        .unwrap();
    let code = resp.status().as_u16();
    (code, resp.body_mut().read_to_string().unwrap_or_default())
}

/// `GET path` of the dashboard, as a browser on 127.0.0.1 asks for it.
fn page(port: u16, path: &str) -> (u16, String) {
    page_as(port, path, &format!("127.0.0.1:{port}"))
}

fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The lane of `recipient` in `lanes --json`.
fn lane(db: &Db, recipient: &str) -> Value {
    let v = db.json(&["lanes", "--actor", "alice", "--json"]);
    v["lanes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["recipient"] == recipient)
        .unwrap_or_else(|| panic!("no lane {recipient}: {v}"))
        .clone()
}

/// chromium and chromedriver; `None` (the test skips, and says so) when one is missing,
/// unless `CI` is set.
fn browser_binaries() -> Option<(PathBuf, PathBuf)> {
    let (Some(chromium), Some(chromedriver)) = (
        find(&["chromium", "chromium-browser", "google-chrome"]),
        find(&["chromedriver"]),
    ) else {
        if std::env::var_os("CI").is_some() {
            panic!("CI is set but chromium or chromedriver is missing (.ci/run installs them)");
        }
        eprintln!(
            "skipped: chromium or chromedriver is not installed (apt-get install chromium chromium-driver)"
        );
        return None;
    };
    Some((chromium, chromedriver))
}

#[test]
fn dashboard_in_a_real_browser() {
    if let Some((chromium, chromedriver)) = browser_binaries() {
        scenario(&Db::new(), &chromium, &chromedriver, true);
    }
}

#[test]
fn dashboard_in_a_real_browser_on_postgres() {
    if let Some((chromium, chromedriver)) = browser_binaries() {
        common::on_postgres("dashboard", |db| {
            scenario(db, &chromium, &chromedriver, false)
        });
    }
}

/// The scenario of the [module docs](self) on `db`; `screenshots`: this run takes them (when
/// `OUTBOX_LANES_SCREENSHOTS` asks for them).
fn scenario(db: &Db, chromium: &Path, chromedriver: &Path, screenshots: bool) {
    let r = Recipient::start().unwrap();
    r.set_default(
        "/fail",
        Reply::Response(Response::new(500).with_body(SCRIPT)),
    );
    r.set_default("/hang", Reply::Hang);
    r.set_default("/ok", Reply::Status(200));
    r.set_default(
        "/bad",
        Reply::Response(Response::new(422).with_body("<img src=x onerror=alert(2)>")),
    );
    let (fail, hang, ok, bad) = (r.url("/fail"), r.url("/hang"), r.url("/ok"), r.url("/bad"));
    let mut lines: Vec<String> = (1..=3)
        .map(|i| {
            json!({"id": format!("a{i}"), "to": [&fail, &hang, &ok], "body": {"n": i}}).to_string()
        })
        .collect();
    lines.push(
        json!({"id": "secret", "to": [&bad], "body": {"note": "<b>bold?</b>"},
            "headers": {"Authorization": SECRET_HEADER, "X-Trace": "visible-trace"}})
        .to_string(),
    );
    db.enqueue_lines("alice", &lines);
    let token_file = db.path("admin-token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let relay = Relay::start(
        db,
        &[
            "--admin-addr",
            &addr,
            "--admin-token-file",
            token_file.to_str().unwrap(),
            "--shutdown-grace",
            "1s",
            "--no-progress",
        ],
        &[],
    );
    relay.wait_for_line("serving the dashboard");
    assert!(r.wait_for("/ok", 3, Duration::from_secs(60)));
    assert!(r.wait_for("/fail", 1, Duration::from_secs(60)));
    assert!(r.wait_for("/hang", 1, Duration::from_secs(60)));
    assert!(eventually(|| !db.dead_letters().is_empty()));
    assert!(eventually(|| lane(db, &fail)["last_status"] == 500));

    // The hanging recipient's lane reads "in flight" once its attempt is in flight for a while.
    assert!(eventually(|| page(port, "/lanes?actor=alice")
        .1
        .contains("in flight ")));
    // A name other than localhost (DNS rebinding) gets no page; the probes answer whatever.
    let (code, _) = page_as(port, "/", "evil.example");
    assert_eq!(code, 421);
    assert_eq!(page_as(port, "/healthz", "evil.example").0, 200);
    let (code, _) = page_as(port, "/", &format!("localhost:{port}"));
    assert_eq!(code, 200);
    // Pages run no script and cannot be framed.
    let resp = ureq::get(format!("http://127.0.0.1:{port}/lanes"))
        .call()
        .unwrap();
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    assert!(header("content-security-policy").starts_with("default-src 'none';"));
    assert!(header("content-security-policy").contains("frame-ancestors 'none'"));
    assert_eq!(header("x-frame-options"), "DENY");

    let mut browser = Browser::start(chromium, chromedriver);
    browser.screenshots = screenshots;
    let base = format!("http://{addr}");
    let mut seen = String::new();

    // The overview.
    browser.goto(&format!("{base}/"));
    assert_eq!(browser.text("h1"), "Overview");
    assert!(browser.text("#pending").parse::<u64>().unwrap() >= 3);
    assert!(browser.source().contains("alice"));
    assert!(browser.text("#in-flight").contains(hang.as_str()));
    // The relay holds alice's drain slot while the hanging attempt is in flight.
    assert!(browser.text("#relays").starts_with("1 relay"));
    browser.screenshot("overview");
    seen.push_str(&browser.source());

    // The lanes: the 500's body is text, not markup, and never ran.
    browser.goto(&format!("{base}/lanes?actor=alice"));
    let table = browser.text("#lanes");
    for url in [&fail, &hang, &ok] {
        assert!(table.contains(url.as_str()), "{table}");
    }
    assert!(table.contains(SCRIPT), "the body as text: {table}");
    browser.no_alert();
    assert_eq!(
        browser.script("return document.querySelectorAll('script').length"),
        json!(0),
        "no script element in the page"
    );
    assert!(
        browser
            .source()
            .contains("&lt;script&gt;alert(1)&lt;/script&gt;")
    );
    browser.screenshot("lanes");
    seen.push_str(&browser.source());

    // A row's delivery per recipient, with the attempts the delivery log keeps.
    browser.goto(&format!("{base}/row?actor=alice&id=a1"));
    let row = browser.text("#row");
    assert!(row.contains("delivered at"), "{row}");
    assert!(row.contains("in flight"), "{row}");
    let history = browser.text("table.history");
    assert!(history.contains(SCRIPT), "{history}");
    browser.no_alert();
    browser.screenshot("row");
    seen.push_str(&browser.source());

    // The hosts.
    browser.goto(&format!("{base}/hosts"));
    let hosts = browser.text("#hosts");
    assert!(hosts.contains("127.0.0.1"), "{hosts}");
    // This relay's figures for the host: a success rate over the attempts that made a request.
    assert!(hosts.contains(" %"), "{hosts}");
    seen.push_str(&browser.source());

    // The dead letters: the row's Authorization header is masked, the 422's body is text.
    browser.goto(&format!("{base}/dead-letters"));
    let table = browser.text("#dead-letters");
    assert!(table.contains("permanent"), "{table}");
    browser.screenshot("dead-letters");
    let id = db.dead_letters()[0]["id"].as_i64().unwrap();
    browser.goto(&format!("{base}/dead-letters/{id}"));
    let headers = browser.text("#headers");
    assert!(
        headers.contains("(masked)") && headers.contains("visible-trace"),
        "{headers}"
    );
    assert!(
        browser
            .text("#last-error")
            .contains("<img src=x onerror=alert(2)>")
    );
    assert!(browser.text("#payload").contains("<b>bold?</b>"));
    let history = browser.text("table.history");
    assert!(
        history.contains("422") && history.contains("<img src=x onerror=alert(2)>"),
        "{history}"
    );
    browser.no_alert();
    browser.screenshot("dead-letter");
    seen.push_str(&browser.source());

    // Not logged in: no action is offered, and one sent anyway is refused and changes nothing.
    let lane_page = format!(
        "{base}/lane?actor=alice&recipient={}",
        enc(lane(db, &fail)["recipient"].as_str().unwrap())
    );
    browser.goto(&lane_page);
    assert!(browser.find("#lane-pause").is_none());
    let pause = [
        ("actor", "alice"),
        ("recipient", fail.as_str()),
        ("op", "pause"),
        ("csrf", ""),
    ];
    let (code, body) = post_form(port, "/actions/lane", &pause, None);
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("log in"), "{body}");
    let (code, _) = post_form(port, "/login", &[("token", "not-the-token-at-all")], None);
    assert_eq!(code, 403);
    assert_eq!(lane(db, &fail)["paused"], false);

    // Logged in with the token: "Pause" pauses the lane, and the command sees it.
    browser.goto(&format!("{base}/login"));
    browser.type_into("#token", TOKEN);
    browser.click("#login");
    assert!(eventually(|| browser
        .find("form[action='/logout']")
        .is_some()));
    // The session's cookie alone is not enough: the form's CSRF token is needed too.
    let cookie = browser
        .cookies()
        .into_iter()
        .find(|c| c["name"] == "outbox_lanes_admin")
        .expect("the session cookie");
    assert_eq!(cookie["httpOnly"], true);
    assert_eq!(cookie["sameSite"], "Strict");
    let cookie = format!("outbox_lanes_admin={}", cookie["value"].as_str().unwrap());
    let (code, body) = post_form(port, "/actions/lane", &pause, Some(&cookie));
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("CSRF"), "{body}");
    assert_eq!(lane(db, &fail)["paused"], false);

    browser.goto(&lane_page);
    browser.click("#lane-pause");
    assert!(
        eventually(|| browser.find("#done").is_some()),
        "{}",
        browser.source()
    );
    assert!(browser.text("#done").starts_with("pause: "));
    assert!(browser.text("#state").starts_with("paused"));
    let l = lane(db, &fail);
    assert_eq!(l["paused"], true, "{l}");
    assert_eq!(l["state"], "paused", "{l}");
    browser.screenshot("lane");
    seen.push_str(&browser.source());

    // A host blocked and unblocked from its page, as `hosts` then shows it.
    let origin = format!("http://127.0.0.1:{}", r.addr().port());
    let host_state = || {
        let v = db.json(&["hosts", "--json"]);
        v["hosts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h["origin"] == origin.as_str())
            .unwrap_or_else(|| panic!("no host {origin}: {v}"))["state"]
            .clone()
    };
    browser.goto(&format!("{base}/hosts"));
    browser.screenshot("hosts");
    browser.click("button[data-op=block]");
    assert!(eventually(|| browser.find("#done").is_some()));
    assert_eq!(host_state(), "blocked");
    browser.click("button[data-op=unblock]");
    assert!(eventually(|| browser
        .try_text("#done")
        .is_some_and(|t| t.starts_with("unblock"))));
    assert_eq!(host_state(), "open");

    // Dead letters replayed after a preview that lists them.
    browser.goto(&format!(
        "{base}/dead-letters/preview?op=replay&reason=permanent"
    ));
    assert_eq!(browser.text("#count"), "1");
    browser.screenshot("replay-preview");
    browser.click("#confirm");
    assert!(eventually(|| browser.find("#done").is_some()));
    assert!(
        browser.text("#done").starts_with("replayed 1"),
        "{}",
        browser.text("#done")
    );
    // Sent again, refused again: a new dead letter, which a purge after its preview removes.
    assert!(r.wait_for("/bad", 2, Duration::from_secs(60)));
    assert!(eventually(|| db.dead_letters().len() == 1));
    browser.goto(&format!(
        "{base}/dead-letters/preview?op=purge&actor=alice&recipient={}",
        enc(&bad)
    ));
    assert_eq!(browser.text("#count"), "1");
    assert_eq!(db.dead_letters().len(), 1, "a preview changes nothing");
    browser.click("#confirm");
    assert!(eventually(|| browser
        .try_text("#done")
        .is_some_and(|t| t.starts_with("purged 1"))));
    assert!(db.dead_letters().is_empty());

    // A dead letter whose recipient already has it (an attempt in flight when its unit was
    // set aside delivered it; cli/tests/host_fence.rs makes one the real way, here its last
    // error is written directly): a replay's preview leaves it out and says so, and its own
    // page warns beside the Replay button.
    db.enqueue_lines(
        "alice",
        &[json!({"id": "again", "to": [&bad], "body": {}}).to_string()],
    );
    assert!(eventually(|| db.dead_letters().len() == 1));
    let dead = db.dead_letters()[0]["id"].as_i64().unwrap();
    db.sql(&format!(
        "UPDATE ol_dead_letters SET last_error = '{}' WHERE id = {dead}",
        outbox_lanes::store::DELIVERED_AFTER_SET_ASIDE
    ));
    browser.goto(&format!(
        "{base}/dead-letters/preview?op=replay&actor=alice"
    ));
    assert_eq!(browser.text("#count"), "0");
    assert!(
        browser
            .text("#skipped")
            .starts_with("Left out: 1 dead letter(s)"),
        "{}",
        browser.text("#skipped")
    );
    assert!(browser.find("#confirm").is_none(), "nothing to replay");
    browser.screenshot("replay-preview-delivered");
    browser.goto(&format!("{base}/dead-letters/preview?op=purge&actor=alice"));
    assert_eq!(browser.text("#count"), "1", "a purge keeps it");
    assert!(browser.find("#skipped").is_none());
    browser.goto(&format!("{base}/dead-letters/{dead}"));
    assert!(
        browser.text("#delivered").contains("already has it"),
        "{}",
        browser.source()
    );
    assert!(
        browser.find("#dead-replay").is_some(),
        "still replayable by hand"
    );

    // No page showed the token or the credential.
    assert!(!seen.contains(TOKEN));
    assert!(!seen.contains("t0k3n-do-not-show-me"));

    // The probes are served on the dashboard's address too.
    assert_eq!(get(port, "/healthz"), Some((200, "ok\n".to_owned())));
    assert_eq!(get(port, "/readyz"), Some((200, "ready\n".to_owned())));
    let (code, metrics) = get(port, "/metrics").unwrap();
    assert_eq!(code, 200);
    assert!(metrics.ends_with("# EOF\n"), "{metrics}");

    drop(browser);
    let (_, lines) = relay.stop();
    assert!(
        lines.iter().all(|l| !l.contains(TOKEN)),
        "{}",
        lines.join("\n")
    );

    // Without --admin-token-file the dashboard is read-only: no login, every action 403.
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let relay = Relay::start(db, &["--admin-addr", &addr, "--no-progress"], &[]);
    relay.wait_for_line("serving the dashboard");
    let (code, body) = post_form(port, "/login", &[("token", TOKEN)], None);
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("read-only"), "{body}");
    let (code, body) = post_form(
        port,
        "/actions/host",
        &[("origin", origin.as_str()), ("op", "block"), ("csrf", "")],
        Some("outbox_lanes_admin=whatever"),
    );
    assert_eq!(code, 403, "{body}");
    assert_eq!(host_state(), "open");
    let (code, body) = page(port, "/lanes?actor=alice");
    assert_eq!(code, 200);
    assert!(
        body.contains("read-only") && !body.contains("action=\"/actions/"),
        "{body}"
    );
    let _ = relay.stop();
}

/// An `--admin-token-file` that cannot serve stops the relay before it touches the database.
#[test]
fn a_token_file_that_cannot_serve_exits_2_and_creates_nothing() {
    let db = Db::new();
    let short = db.path("short-token");
    std::fs::write(&short, "too-short\n").unwrap();
    let missing = db.path("no-such-token");
    for (file, says) in [
        (&short, "shorter than 16 bytes"),
        (&missing, "no-such-token"),
    ] {
        let out = common::collect(
            db.command(&[
                "relay",
                "--admin-addr",
                "127.0.0.1:0",
                "--admin-token-file",
                file.to_str().unwrap(),
            ])
            .spawn()
            .unwrap(),
            "",
        );
        assert_eq!(out.code(), Some(2), "{}", out.stderr);
        assert!(
            out.stderr.contains("--admin-token-file") && out.stderr.contains(says),
            "{}",
            out.stderr
        );
        assert!(!db.file().exists(), "the relay created its database");
    }
}
