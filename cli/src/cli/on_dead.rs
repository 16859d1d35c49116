//! `relay --on-dead-letter CMD`: an operator's command run for every dead letter, off the
//! delivery path.
//!
//! The driver calls the dead-letter hook on a pass's thread once the dead letter is durable.
//! The hook only formats the dead letter as JSON and puts it in a bounded queue without
//! waiting ([`Sink::send`]): a pass never waits for a command, and a slow, hanging or failing
//! command costs no delivery. A dispatcher task takes the queue in order and runs
//! `sh -c CMD` for each dead letter, at most `--on-dead-letter-concurrency` at once, the JSON
//! on the command's stdin; a non-zero exit or a failure to start is logged at WARN, naming the
//! command by its program and length only (the rest of a command line may carry a token).
//! Should the queue fill up (a command far slower than dead letters arrive), the dead letters
//! past it are not passed on: they are in the store all the same (`dead-letters list`). That
//! is logged at WARN for the 1st, 2nd, 4th, 8th… dead letter left out, with the count so far,
//! so that a deep lane retired at once (one dead letter per unit) does not flood the log.
//!
//! A command does not inherit the relay's secrets (`OUTBOX_LANES_WEBHOOK_SECRET`, and
//! `OUTBOX_LANES_DB` when its URL carries a password). Its stdout and stderr are the relay's
//! own log lines (INFO and WARN, each line cut at [`LINE_CAP`] bytes), so that
//! `--log-format json` stays JSON on every line.
//!
//! Each command runs in a process group of its own. When the relay stops, the commands
//! queued and running get the shutdown grace to finish; after it, the process group of each
//! one still running gets SIGTERM, and SIGKILL [`TERM_WAIT`] later if anything of it is
//! left, so that what a command started in the background goes with it (a WARN counts them).

use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use outbox_lanes_tokio::DeadLettered;
use serde::Serialize;
use tokio::io::{AsyncBufReadExt as _, AsyncRead, AsyncWriteExt as _, BufReader};
use tokio::process::Child;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::{JoinHandle, JoinSet};
use tracing::{debug, info, warn};

use super::db_url::db_url_secrets;
use super::output::time;

/// Dead letters waiting for a command, at most.
pub(crate) const QUEUE: usize = 10_000;

/// A line a command writes is logged up to this many bytes, then cut (with a marker).
pub(crate) const LINE_CAP: usize = 4096;

/// How long a command stopped at the end of the grace has to go, its process group with it,
/// between SIGTERM and SIGKILL.
pub(crate) const TERM_WAIT: Duration = Duration::from_secs(2);

/// How long a command's output is read to its end once the command exited: something it left
/// in the background may keep the pipe open (then the rest is logged as it comes).
const OUTPUT_WAIT: Duration = Duration::from_secs(1);

/// The JSON a command reads on its stdin: one object, then end of input.
#[derive(Debug, Serialize)]
struct Json<'a> {
    /// The dead letter's id, as `dead-letters list` shows it and `show`, `replay` and
    /// `purge --id` take it.
    id: i64,
    actor: &'a str,
    recipient: &'a str,
    unit: u64,
    row_id: &'a str,
    reason: &'static str,
    status: Option<u16>,
    error: Option<&'a str>,
    attempts: u32,
    dead_at: String,
}

/// The JSON of one dead letter.
pub(crate) fn json(d: &DeadLettered) -> String {
    let j = Json {
        id: d.id.0,
        actor: d.actor.as_str(),
        recipient: &d.recipient,
        unit: d.unit.0,
        row_id: &d.row_id,
        reason: d.reason.as_str(),
        status: d.status,
        error: d.error.as_deref(),
        attempts: d.attempts,
        dead_at: time(d.at),
    };
    let mut s = serde_json::to_string(&j).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"));
    s.push('\n');
    s
}

/// The hook's end of the queue: cheap to call from a pass's thread, never blocks.
#[derive(Debug, Clone)]
pub(crate) struct Sink {
    tx: mpsc::Sender<(String, String)>,
    /// Dead letters queued or whose command runs.
    unfinished: Arc<AtomicUsize>,
    /// Dead letters not passed on because the queue was full, since the relay started.
    dropped: Arc<AtomicU64>,
}

/// Whether the `n`-th dead letter left out of a full queue is logged: the 1st, 2nd, 4th, 8th…
fn worth_a_warning(n: u64) -> bool {
    n.is_power_of_two()
}

impl Sink {
    /// Queues the command for `d`, or logs at WARN why it will not run.
    pub(crate) fn send(&self, d: &DeadLettered) {
        let label = format!("{} {} {}", d.actor, d.unit, d.recipient);
        // Counted before it can be taken, so that the count never goes below zero.
        self.unfinished.fetch_add(1, Ordering::SeqCst);
        let sent = self.tx.try_send((label, json(d)));
        if sent.is_err() {
            self.unfinished.fetch_sub(1, Ordering::SeqCst);
        }
        match sent {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                if worth_a_warning(n) {
                    warn!(
                        actor = %d.actor, unit = %d.unit, recipient = %d.recipient,
                        dead_letter = d.id.0, not_passed_on = n,
                        "--on-dead-letter: {QUEUE} dead letters already wait for the command; \
                         {n} dead letter(s) not passed on so far, this one included (they are \
                         kept in the store: dead-letters list); logged again at twice as many"
                    );
                }
            }
            Err(mpsc::error::TrySendError::Closed(_)) => warn!(
                actor = %d.actor, unit = %d.unit, recipient = %d.recipient,
                "--on-dead-letter: the relay is stopping; the command is not run for this \
                 dead letter (it is kept in the store: dead-letters list)"
            ),
        }
    }
}

/// The command and how it is run. No `Debug`: the command line may carry a token.
struct Hook {
    cmd: String,
    /// What logs name the command by: its program.
    program: Arc<str>,
    /// The relay's secrets in its environment, which the command does not inherit.
    secret_env: Vec<&'static str>,
}

impl Hook {
    fn new(cmd: String) -> Hook {
        Hook {
            program: program(&cmd).into(),
            secret_env: secret_env(|name| std::env::var(name).ok()),
            cmd,
        }
    }

    fn spawn(&self) -> std::io::Result<Child> {
        let mut c = tokio::process::Command::new("sh");
        c.arg("-c")
            .arg(&self.cmd)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for name in &self.secret_env {
            c.env_remove(name);
        }
        // Its own group: at stop, what the command started goes with it.
        #[cfg(unix)]
        c.process_group(0);
        c.spawn()
    }
}

/// The program a shell command line runs, for logs: its first word that is not a variable
/// assignment (`TOKEN=… notify …` is named `notify`), at most 64 characters.
fn program(cmd: &str) -> String {
    let assignment = |w: &str| {
        w.split_once('=').is_some_and(|(name, _)| {
            !name.is_empty() && name.chars().all(|c| c == '_' || c.is_ascii_alphanumeric())
        })
    };
    let word = cmd
        .split_whitespace()
        .find(|w| !assignment(w))
        .unwrap_or("sh");
    word.chars().take(64).collect()
}

/// The variables (of those the relay reads) that hold a secret: the webhook secret, and the
/// database URL when it carries a password. `var` reads the environment.
fn secret_env(var: impl Fn(&str) -> Option<String>) -> Vec<&'static str> {
    let mut names = vec!["OUTBOX_LANES_WEBHOOK_SECRET"];
    if var("OUTBOX_LANES_DB").is_some_and(|db| !db_url_secrets(&db).is_empty()) {
        names.push("OUTBOX_LANES_DB");
    }
    names
}

/// The dispatcher of the commands.
#[derive(Debug)]
pub(crate) struct Runner {
    stop: oneshot::Sender<()>,
    /// `true`: the grace is over; the commands running are stopped, the queued ones dropped.
    kill: watch::Sender<bool>,
    task: JoinHandle<()>,
    unfinished: Arc<AtomicUsize>,
}

/// Starts the dispatcher of `cmd`, at most `concurrency` at once. Call it inside the tokio
/// runtime.
pub(crate) fn start(cmd: String, concurrency: usize) -> (Sink, Runner) {
    let (tx, rx) = mpsc::channel(QUEUE);
    let (stop, stopped) = oneshot::channel();
    let (kill, killed) = watch::channel(false);
    let unfinished = Arc::new(AtomicUsize::new(0));
    let task = tokio::spawn(dispatch(
        Arc::new(Hook::new(cmd)),
        concurrency.max(1),
        rx,
        stopped,
        killed,
        Arc::clone(&unfinished),
    ));
    (
        Sink {
            tx,
            unfinished: Arc::clone(&unfinished),
            dropped: Arc::default(),
        },
        Runner {
            stop,
            kill,
            task,
            unfinished,
        },
    )
}

impl Runner {
    /// Runs what is queued, and waits up to `grace` for every command to finish; then
    /// stops those still running with their process groups (SIGTERM, SIGKILL [`TERM_WAIT`]
    /// later) and drops those still queued.
    pub(crate) async fn finish(self, grace: Duration) {
        let _ = self.stop.send(());
        let mut task = self.task;
        if tokio::time::timeout(grace, &mut task).await.is_ok() {
            return;
        }
        let left = self.unfinished.load(Ordering::SeqCst);
        let _ = self.kill.send(true);
        // Each command is gone within TERM_WAIT of the SIGTERM; its output is read for at
        // most OUTPUT_WAIT after. The bound past those is for a child that cannot be reaped.
        let bound = TERM_WAIT + OUTPUT_WAIT + Duration::from_secs(2);
        if tokio::time::timeout(bound, &mut task).await.is_err() {
            // Dropping a command's group kills it (`Group`'s drop).
            task.abort();
            let _ = task.await;
        }
        if left > 0 {
            warn!(
                grace = ?grace,
                dead_letters = left,
                "--on-dead-letter: stopping; the commands still queued or running were not \
                 run or were killed with their process groups (the dead letters are in the \
                 store: dead-letters list)"
            );
        }
    }
}

async fn dispatch(
    hook: Arc<Hook>,
    concurrency: usize,
    mut rx: mpsc::Receiver<(String, String)>,
    mut stopped: oneshot::Receiver<()>,
    killed: watch::Receiver<bool>,
    unfinished: Arc<AtomicUsize>,
) {
    let mut running = JoinSet::new();
    let mut stopping = false;
    loop {
        while running.len() >= concurrency {
            let _ = running.join_next().await;
        }
        if *killed.borrow() {
            break;
        }
        let next = if stopping {
            rx.try_recv().ok()
        } else {
            tokio::select! {
                next = rx.recv() => next,
                _ = &mut stopped => {
                    // The relay stopped: no pass runs any more; run what is queued.
                    stopping = true;
                    rx.close();
                    continue;
                }
                Some(_) = running.join_next(), if !running.is_empty() => continue,
            }
        };
        let Some((label, json)) = next else { break };
        let unfinished = Arc::clone(&unfinished);
        let hook = Arc::clone(&hook);
        let killed = killed.clone();
        running.spawn(async move {
            run_one(&hook, label, json, killed).await;
            unfinished.fetch_sub(1, Ordering::SeqCst);
        });
    }
    while running.join_next().await.is_some() {}
}

async fn run_one(hook: &Hook, label: String, json: String, mut killed: watch::Receiver<bool>) {
    let command = &*hook.program;
    let command_len = hook.cmd.len();
    let mut child = match hook.spawn() {
        Ok(c) => c,
        Err(e) => {
            warn!(dead_letter = %label, command, command_len, error = %e,
                "--on-dead-letter: cannot start the command");
            return;
        }
    };
    let mut group = Group::of(&child);
    let label: Arc<str> = label.into();
    let mut output = JoinSet::new();
    if let Some(out) = child.stdout.take() {
        output.spawn(forward(
            out,
            Stream::Stdout,
            Arc::clone(&hook.program),
            Arc::clone(&label),
        ));
    }
    if let Some(err) = child.stderr.take() {
        output.spawn(forward(
            err,
            Stream::Stderr,
            Arc::clone(&hook.program),
            Arc::clone(&label),
        ));
    }
    let stdin = child.stdin.take();
    let ran = tokio::select! {
        status = async {
            if let Some(mut stdin) = stdin {
                // A command that does not read its input closes the pipe: not a failure of ours.
                if let Err(e) = stdin.write_all(json.as_bytes()).await {
                    debug!(dead_letter = %label, error = %e, "--on-dead-letter: stdin not read");
                }
            }
            child.wait().await
        } => Some(status),
        // Also when the runner is gone: the relay is exiting.
        _ = killed.wait_for(|k| *k) => None,
    };
    let stopped = ran.is_none();
    let status = match ran {
        Some(status) => {
            // What it left in the background is not ours to stop.
            group.disarm();
            status
        }
        None => stop(&mut child, &mut group).await,
    };
    drain(output).await;
    match status {
        // Counted in the runner's warning.
        _ if stopped => debug!(dead_letter = %label, command, status = ?status.ok(),
            "--on-dead-letter: the command was stopped at the end of the grace"),
        Ok(s) if s.success() => debug!(dead_letter = %label, "--on-dead-letter: command done"),
        Ok(s) => warn!(dead_letter = %label, command, command_len, status = %s,
            "--on-dead-letter: the command failed"),
        Err(e) => warn!(dead_letter = %label, command, command_len, error = %e,
            "--on-dead-letter: cannot wait for the command"),
    }
}

/// Waits up to [`OUTPUT_WAIT`] for a command's output to end; the readers left go on alone.
async fn drain(mut output: JoinSet<()>) {
    let all = async { while output.join_next().await.is_some() {} };
    let _ = tokio::time::timeout(OUTPUT_WAIT, all).await;
    output.detach_all();
}

/// Stops a command and its process group: SIGTERM, then SIGKILL to what is left of it after
/// [`TERM_WAIT`]; reaps the command.
async fn stop(child: &mut Child, group: &mut Group) -> std::io::Result<ExitStatus> {
    group.terminate(child);
    let deadline = tokio::time::Instant::now() + TERM_WAIT;
    let mut status = None;
    loop {
        if status.is_none() {
            status = child.try_wait().transpose();
        }
        // The group outlives its leader while anything it started runs.
        if status.is_some() && !group.alive() {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            group.kill(child);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    group.disarm();
    match status {
        Some(s) => s,
        None => child.wait().await,
    }
}

/// A command's process group (led by its `sh`), as long as the command is not reaped; it is
/// killed if dropped then (a relay that exits without waiting).
struct Group {
    #[cfg(unix)]
    id: Option<nix::unistd::Pid>,
}

impl Group {
    fn of(child: &Child) -> Group {
        #[cfg(unix)]
        {
            let id = child
                .id()
                .and_then(|id| i32::try_from(id).ok())
                .map(nix::unistd::Pid::from_raw);
            Group { id }
        }
        #[cfg(not(unix))]
        {
            let _ = child;
            Group {}
        }
    }

    /// SIGTERM to the whole group.
    fn terminate(&self, child: &mut Child) {
        #[cfg(unix)]
        {
            let _ = child;
            if let Some(id) = self.id {
                let _ = nix::sys::signal::killpg(id, nix::sys::signal::Signal::SIGTERM);
            }
        }
        #[cfg(not(unix))]
        let _ = child.start_kill();
    }

    /// SIGKILL to the whole group.
    fn kill(&self, child: &mut Child) {
        #[cfg(unix)]
        if let Some(id) = self.id {
            let _ = nix::sys::signal::killpg(id, nix::sys::signal::Signal::SIGKILL);
        }
        let _ = child.start_kill();
    }

    /// Whether a process of the group is left.
    fn alive(&self) -> bool {
        #[cfg(unix)]
        {
            self.id.is_some_and(|id| {
                nix::sys::signal::killpg(id, None) != Err(nix::errno::Errno::ESRCH)
            })
        }
        #[cfg(not(unix))]
        {
            false
        }
    }

    /// The group is no longer ours to kill.
    fn disarm(&mut self) {
        #[cfg(unix)]
        {
            self.id = None;
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        #[cfg(unix)]
        if let Some(id) = self.id.take() {
            let _ = nix::sys::signal::killpg(id, nix::sys::signal::Signal::SIGKILL);
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Stream {
    Stdout,
    Stderr,
}

/// Logs each line `out` gives as the relay's own (stdout at INFO, stderr at WARN), cut at
/// [`LINE_CAP`] bytes: at most that much of a line is held, however long it is.
async fn forward(out: impl AsyncRead + Unpin, stream: Stream, command: Arc<str>, label: Arc<str>) {
    let mut out = BufReader::new(out);
    let mut line = Vec::new();
    let mut cut = false;
    loop {
        let buf = match out.fill_buf().await {
            Ok(buf) => buf,
            Err(e) => {
                debug!(dead_letter = %label, error = %e, ?stream,
                    "--on-dead-letter: cannot read the command's output");
                break;
            }
        };
        if buf.is_empty() {
            break;
        }
        let end = buf.iter().position(|&b| b == b'\n');
        let chunk = &buf[..end.unwrap_or(buf.len())];
        let room = LINE_CAP.saturating_sub(line.len());
        cut |= chunk.len() > room;
        line.extend_from_slice(&chunk[..chunk.len().min(room)]);
        let used = end.map_or(buf.len(), |i| i + 1);
        out.consume(used);
        if end.is_some() {
            log_line(stream, &command, &label, &line, cut);
            line.clear();
            cut = false;
        }
    }
    if !line.is_empty() || cut {
        log_line(stream, &command, &label, &line, cut);
    }
}

fn log_line(stream: Stream, command: &str, label: &str, line: &[u8], cut: bool) {
    let text = String::from_utf8_lossy(line);
    let text = text.strip_suffix('\r').unwrap_or(&text);
    // Control characters (a terminal's escapes) are shown, not sent to the terminal.
    let mut shown = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() && c != '\t' {
            shown.extend(c.escape_default());
        } else {
            shown.push(c);
        }
    }
    if cut {
        shown.push_str(&format!(" …[cut at {LINE_CAP} bytes]"));
    }
    match stream {
        Stream::Stdout => info!(command, dead_letter = %label, line = %shown,
            "--on-dead-letter: the command's stdout"),
        Stream::Stderr => warn!(command, dead_letter = %label, line = %shown,
            "--on-dead-letter: the command's stderr"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_lanes_core::{ActorId, DeadReason, Timestamp, UnitId};
    use outbox_lanes_tokio::store::DeadLetterId;

    /// A full queue leaves the dead letters past it out and counts them; the warning comes
    /// at the 1st, 2nd, 4th, 8th… only (a deep lane retired at once must not flood the log).
    #[test]
    fn a_full_queue_counts_what_it_leaves_out_and_warns_at_powers_of_two() {
        let (tx, _rx) = mpsc::channel(2);
        let sink = Sink {
            tx,
            unfinished: Arc::default(),
            dropped: Arc::default(),
        };
        for unit in 0..10 {
            sink.send(&dead(unit));
        }
        assert_eq!(sink.dropped.load(Ordering::Relaxed), 8);
        assert_eq!(sink.unfinished.load(Ordering::SeqCst), 2);
        let warned: Vec<u64> = (1..=1000).filter(|&n| worth_a_warning(n)).collect();
        assert_eq!(warned, [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]);
    }

    fn dead(unit: u64) -> DeadLettered {
        DeadLettered {
            id: DeadLetterId(i64::try_from(unit).unwrap() + 100),
            actor: ActorId::new("alice"),
            unit: UnitId(unit),
            row_id: format!("r{unit}"),
            recipient: "http://127.0.0.1:1/inbox".into(),
            reason: DeadReason::Gone,
            status: Some(410),
            error: None,
            attempts: 1,
            at: Timestamp::from_millis(1_500),
        }
    }

    /// Every queued command runs, never more than the bound at once: each one marks itself
    /// running, counts the marks, and records the count before it unmarks itself.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn commands_are_bounded_and_all_run_by_the_finish() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display();
        std::fs::create_dir(dir.path().join("running")).unwrap();
        let cmd = format!(
            "touch {d}/running/$$; ls {d}/running | wc -l >> {d}/counts; \
             cat > {d}/in-$$.json; sleep 0.1; rm {d}/running/$$"
        );
        let (sink, runner) = start(cmd, 2);
        for unit in 0..6 {
            sink.send(&dead(unit));
        }
        runner.finish(Duration::from_secs(60)).await;
        let counts: Vec<u32> = std::fs::read_to_string(dir.path().join("counts"))
            .unwrap()
            .lines()
            .map(|l| l.trim().parse().unwrap())
            .collect();
        assert_eq!(counts.len(), 6, "{counts:?}");
        assert!(counts.iter().all(|&n| (1..=2).contains(&n)), "{counts:?}");
        let mut units: Vec<u64> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .map(|p| {
                let v: serde_json::Value =
                    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
                v["unit"].as_u64().unwrap()
            })
            .collect();
        units.sort_unstable();
        assert_eq!(units, [0, 1, 2, 3, 4, 5]);
        assert_eq!(sink.unfinished.load(Ordering::SeqCst), 0);
        // After the finish, the queue is closed: a late dead letter is logged, not run.
        sink.send(&dead(6));
        assert_eq!(sink.unfinished.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_command_is_named_by_its_program() {
        assert_eq!(program("notify --token t0k3n"), "notify");
        assert_eq!(
            program("  TOKEN=t0k3n A_B=1 /usr/bin/curl -d @- x"),
            "/usr/bin/curl"
        );
        assert_eq!(program("a=b"), "sh");
        assert_eq!(program(&"x".repeat(100)).len(), 64);
    }

    #[test]
    fn secrets_are_not_inherited() {
        let env =
            |db: &'static str| move |name: &str| (name == "OUTBOX_LANES_DB").then(|| db.to_owned());
        assert_eq!(
            secret_env(env("./outbox.db")),
            ["OUTBOX_LANES_WEBHOOK_SECRET"]
        );
        assert_eq!(
            secret_env(env("postgres://u@h/db")),
            ["OUTBOX_LANES_WEBHOOK_SECRET"]
        );
        for db in ["postgres://u:pw@h/db", "postgres://u@h/db?password=pw"] {
            assert_eq!(
                secret_env(env(db)),
                ["OUTBOX_LANES_WEBHOOK_SECRET", "OUTBOX_LANES_DB"],
                "{db}"
            );
        }
    }

    #[test]
    fn json_names_the_dead_letter() {
        let d = DeadLettered {
            id: DeadLetterId(3),
            actor: ActorId::new("alice"),
            unit: UnitId(7),
            row_id: "r1".into(),
            recipient: "http://127.0.0.1:1/inbox".into(),
            reason: DeadReason::Permanent,
            status: Some(422),
            error: Some("status 422".into()),
            attempts: 1,
            at: Timestamp::from_millis(1_500),
        };
        let v: serde_json::Value = serde_json::from_str(&json(&d)).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "id": 3, "actor": "alice", "recipient": "http://127.0.0.1:1/inbox",
                "unit": 7, "row_id": "r1", "reason": "permanent", "status": 422,
                "error": "status 422", "attempts": 1, "dead_at": "1970-01-01T00:00:01.500Z",
            })
        );
    }
}
