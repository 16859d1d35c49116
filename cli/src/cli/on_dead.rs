//! `relay --on-dead-letter CMD`: an operator's command run for every dead letter, off the
//! delivery path.
//!
//! The driver calls the dead-letter hook on a pass's thread once the dead letter is durable.
//! The hook only formats the dead letter as JSON and puts it in a bounded queue without
//! waiting ([`Sink::send`]): a pass never waits for a command, and a slow, hanging or failing
//! command costs no delivery. A dispatcher task takes the queue in order and runs
//! `sh -c CMD` for each dead letter, at most `--on-dead-letter-concurrency` at once, the JSON
//! on the command's stdin (its stdout and stderr are the relay's); a non-zero exit or a
//! failure to start is logged at WARN. Should the queue fill up (a command far slower than
//! dead letters arrive), the dead letters past it are not passed on: they are in the store
//! all the same (`dead-letters list`). That is logged at WARN for the 1st, 2nd, 4th, 8th…
//! dead letter left out, with the count so far, so that a deep lane retired at once (one
//! dead letter per unit) does not flood the log.
//!
//! When the relay stops, the commands queued and running get the shutdown grace to finish;
//! those still running after it are killed, with a WARN.

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use outbox_lanes_tokio::DeadLettered;
use serde::Serialize;
use tokio::io::AsyncWriteExt as _;
use tokio::sync::{mpsc, oneshot};
use tokio::task::{JoinHandle, JoinSet};
use tracing::{debug, warn};

use super::output::time;

/// Dead letters waiting for a command, at most.
pub(crate) const QUEUE: usize = 10_000;

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

/// The dispatcher of the commands.
#[derive(Debug)]
pub(crate) struct Runner {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
    unfinished: Arc<AtomicUsize>,
}

/// Starts the dispatcher of `cmd`, at most `concurrency` at once. Call it inside the tokio
/// runtime.
pub(crate) fn start(cmd: String, concurrency: usize) -> (Sink, Runner) {
    let (tx, rx) = mpsc::channel(QUEUE);
    let (stop, stopped) = oneshot::channel();
    let unfinished = Arc::new(AtomicUsize::new(0));
    let task = tokio::spawn(dispatch(
        cmd,
        concurrency.max(1),
        rx,
        stopped,
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
            task,
            unfinished,
        },
    )
}

impl Runner {
    /// Runs what is queued, and waits up to `grace` for every command to finish; kills
    /// those still running after it.
    pub(crate) async fn finish(self, grace: Duration) {
        let _ = self.stop.send(());
        let mut task = self.task;
        if tokio::time::timeout(grace, &mut task).await.is_err() {
            task.abort();
            let _ = task.await;
            let left = self.unfinished.load(Ordering::SeqCst);
            if left > 0 {
                warn!(
                    grace = ?grace,
                    dead_letters = left,
                    "--on-dead-letter: stopping; the commands still queued or running were not \
                     run or were killed (the dead letters are in the store: dead-letters list)"
                );
            }
        }
    }
}

async fn dispatch(
    cmd: String,
    concurrency: usize,
    mut rx: mpsc::Receiver<(String, String)>,
    mut stopped: oneshot::Receiver<()>,
    unfinished: Arc<AtomicUsize>,
) {
    // Dropping the set (an abort at the end of the grace) kills the children
    // (`kill_on_drop`).
    let mut running = JoinSet::new();
    let mut stopping = false;
    loop {
        while running.len() >= concurrency {
            let _ = running.join_next().await;
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
        let cmd = cmd.clone();
        running.spawn(async move {
            run_one(cmd, label, json).await;
            unfinished.fetch_sub(1, Ordering::SeqCst);
        });
    }
    while running.join_next().await.is_some() {}
}

async fn run_one(cmd: String, label: String, json: String) {
    let child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(&cmd)
        .stdin(Stdio::piped())
        .kill_on_drop(true)
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            warn!(dead_letter = %label, command = %cmd, error = %e,
                "--on-dead-letter: cannot start the command");
            return;
        }
    };
    if let Some(mut stdin) = child.stdin.take() {
        // A command that does not read its input closes the pipe: not a failure of ours.
        if let Err(e) = stdin.write_all(json.as_bytes()).await {
            debug!(dead_letter = %label, error = %e, "--on-dead-letter: stdin not read");
        }
    }
    match child.wait().await {
        Ok(s) if s.success() => debug!(dead_letter = %label, "--on-dead-letter: command done"),
        Ok(s) => warn!(dead_letter = %label, command = %cmd, status = %s,
            "--on-dead-letter: the command failed"),
        Err(e) => warn!(dead_letter = %label, command = %cmd, error = %e,
            "--on-dead-letter: cannot wait for the command"),
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
