//! `drain` progress on stderr: a bar on a terminal, a plain line a second otherwise, a JSON log
//! event a second with `--log-format json` (so every stderr line parses), nothing with
//! `--no-progress`. The drain's closing summary is written here too, in the same form.
//!
//! What is left comes from the store's status, which counts every pending unit: on a large
//! backlog that read is not free (20–30 ms with 155,000 units pending on SQLite: 11 % of the
//! CPU of a 20,000-lane drain whose recipients are 150 ms away, when it ran every second), so
//! it is spaced out to take at most 1/[`READ_SHARE`] of the time ([`Refresh`]); between reads
//! the line counts down from the last read by what the drain finished since.

use std::io::{IsTerminal as _, Write};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::backend::{Backend, Counters};

/// The progress bar on screen, if any: log lines are written around it, not through it.
static BAR: Mutex<Option<ProgressBar>> = Mutex::new(None);

fn active_bar() -> Option<ProgressBar> {
    BAR.lock().unwrap_or_else(PoisonError::into_inner).clone()
}

fn set_bar(bar: Option<ProgressBar>) {
    *BAR.lock().unwrap_or_else(PoisonError::into_inner) = bar;
}

/// Where logs go: stderr, with the progress bar (if any) lifted while a line is written.
pub(crate) struct LogWriter;

/// One log event's bytes, written to stderr when the event is complete.
pub(crate) struct LogLine(Vec<u8>);

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogWriter {
    type Writer = LogLine;

    fn make_writer(&'a self) -> LogLine {
        LogLine(Vec::new())
    }
}

impl Write for LogLine {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for LogLine {
    fn drop(&mut self) {
        // A log line that cannot be written has nowhere else to go.
        let write = || {
            let _ = std::io::stderr().lock().write_all(&self.0);
        };
        match active_bar() {
            Some(bar) => bar.suspend(write),
            None => write(),
        }
    }
}

/// What the store says is left.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Left {
    /// Units not yet finished.
    pub(crate) remaining: u64,
    /// Lanes with pending units that are throttled or in backoff.
    pub(crate) in_backoff: usize,
    /// Lanes with pending units that are paused or strict blocked.
    pub(crate) paused: usize,
}

/// Reads what is left for `actors` (every actor if `None`).
pub(crate) async fn left(backend: &Backend, actors: Option<&[String]>) -> anyhow::Result<Left> {
    let status = backend.status().await?;
    let mut l = Left::default();
    for a in status
        .iter()
        .filter(|a| actors.is_none_or(|list| list.iter().any(|x| x == a.actor.as_str())))
    {
        l.remaining += a.pending;
        l.in_backoff += a.lanes_in_backoff.len();
        l.paused += a.lanes_paused.len();
    }
    Ok(l)
}

/// How progress and the summary are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Style {
    /// A bar on a terminal, a plain line otherwise.
    Text,
    /// One JSON log event per report, like every other stderr line.
    Json,
}

/// The drain's closing summary.
pub(crate) fn summary(
    style: Style,
    stopped: bool,
    actors: usize,
    delivered: u64,
    dead: u64,
    l: Left,
) {
    let how = if stopped {
        "stopped by a signal after draining"
    } else {
        "drained"
    };
    match style {
        Style::Json => tracing::info!(
            target: "outbox_lanes::drain",
            stopped,
            actors,
            delivered,
            dead_lettered = dead,
            remaining = l.remaining,
            lanes_in_backoff = l.in_backoff,
            lanes_paused = l.paused,
            "drain summary"
        ),
        Style::Text => super::say(&format!(
            "{how} {actors} actor(s): {delivered} delivered, {dead} dead-lettered, {} remaining, \
             {} lane(s) in backoff, {} paused",
            l.remaining, l.in_backoff, l.paused
        )),
    }
}

/// The store's status read takes at most 1/`READ_SHARE` of the time (a 4 ms read: every
/// second; a 24 ms one: every 6 s).
const READ_SHARE: u32 = 250;

/// The last read of what is left, and when the next one is due.
#[derive(Clone, Copy, Debug)]
struct Refresh {
    /// When it was read, and how long the read took.
    at: Instant,
    took: Duration,
    left: Left,
    /// The drain's finished count (delivered + dead-lettered) at the read.
    finished: u64,
}

impl Refresh {
    /// Whether to read again at `now`: once `every` passed, and `READ_SHARE` times the last
    /// read's duration.
    fn due(&self, now: Instant, every: Duration) -> bool {
        now.saturating_duration_since(self.at) >= every.max(self.took * READ_SHARE)
    }

    /// What is left by the last read, less what the drain finished since (`finished` now).
    fn estimate(&self, finished: u64) -> Left {
        Left {
            remaining: self
                .left
                .remaining
                .saturating_sub(finished.saturating_sub(self.finished)),
            ..self.left
        }
    }
}

/// The running display; [`Progress::finish`] stops it.
pub(crate) struct Progress {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Progress {
    /// Starts reporting every `every`.
    pub(crate) fn start(
        backend: Backend,
        actors: Option<Vec<String>>,
        counters: Arc<Counters>,
        every: Duration,
        style: Style,
    ) -> Progress {
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let bar = (style == Style::Text && std::io::stderr().is_terminal()).then(|| {
                let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
                bar.set_style(
                    ProgressStyle::with_template(
                        "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} units  {msg}",
                    )
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
                );
                bar.enable_steady_tick(Duration::from_millis(200));
                set_bar(Some(bar.clone()));
                bar
            });
            let start = Instant::now();
            let mut last = (start, 0u64);
            let mut read: Option<Refresh> = None;
            let mut tick = tokio::time::interval(every);
            tick.tick().await;
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stopped.changed() => break,
                }
                let delivered = counters.delivered.load(Ordering::Relaxed);
                let dead = counters.dead_lettered.load(Ordering::Relaxed);
                let now = Instant::now();
                let secs = now.duration_since(last.0).as_secs_f64().max(0.001);
                let rate = delivered.saturating_sub(last.1) as f64 / secs;
                last = (now, delivered);
                let finished = delivered + dead;
                let l = match read {
                    Some(r) if !r.due(now, every) => r.estimate(finished),
                    _ => {
                        // A failed read leaves the numbers of the previous tick; the drain
                        // reports store failures itself.
                        let Ok(l) = left(&backend, actors.as_deref()).await else {
                            continue;
                        };
                        read = Some(Refresh {
                            at: now,
                            took: now.elapsed(),
                            left: l,
                            finished,
                        });
                        l
                    }
                };
                match (&bar, style) {
                    (Some(bar), _) => {
                        bar.set_length(delivered + dead + l.remaining);
                        bar.set_position(delivered + dead);
                        bar.set_message(format!(
                            "{rate:.1}/s, {dead} dead-lettered, {} lane(s) in backoff, {} paused",
                            l.in_backoff, l.paused
                        ));
                    }
                    (None, Style::Json) => tracing::info!(
                        target: "outbox_lanes::drain",
                        delivered,
                        dead_lettered = dead,
                        remaining = l.remaining,
                        per_second = (rate * 10.0).round() / 10.0,
                        lanes_in_backoff = l.in_backoff,
                        lanes_paused = l.paused,
                        "drain progress"
                    ),
                    (None, Style::Text) => super::say(&format!(
                        "drain: {delivered} delivered, {dead} dead-lettered, {} remaining, \
                         {rate:.1}/s, {} lane(s) in backoff, {} paused",
                        l.remaining, l.in_backoff, l.paused
                    )),
                }
            }
            if let Some(bar) = bar {
                set_bar(None);
                bar.finish_and_clear();
            }
        });
        Progress { stop, task }
    }

    /// Stops the display.
    pub(crate) async fn finish(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_status_read_is_spaced_out_and_counted_down_between_reads() {
        let t0 = Instant::now();
        let every = Duration::from_secs(1);
        let left = Left {
            remaining: 1_000,
            in_backoff: 3,
            paused: 1,
        };
        let fast = Refresh {
            at: t0,
            took: Duration::from_millis(4),
            left,
            finished: 10,
        };
        // A 4 ms read: every second, as before.
        assert!(!fast.due(t0 + Duration::from_millis(999), every));
        assert!(fast.due(t0 + every, every));
        // A 24 ms read (155,000 units pending on SQLite): every 6 s.
        let slow = Refresh {
            took: Duration::from_millis(24),
            ..fast
        };
        assert!(!slow.due(t0 + Duration::from_secs(5), every));
        assert!(slow.due(t0 + Duration::from_secs(6), every));
        // Between reads: the last read less what finished since; the lanes as read.
        let e = slow.estimate(10 + 250);
        assert_eq!((e.remaining, e.in_backoff, e.paused), (750, 3, 1));
        assert_eq!(slow.estimate(5_000).remaining, 0, "never below zero");
        assert_eq!(slow.estimate(3).remaining, 1_000, "a count that went back");
    }
}
