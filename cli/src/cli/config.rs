//! `--config FILE`: settings from a TOML file, as defaults beneath the environment and the
//! command line.
//!
//! A key is the long name of any flag of any command (`concurrency = 512`,
//! `timeout = "10s"`, `retry-delays = ["1s", "5s"]`, `allow-private-destinations = true`;
//! `snake_case` spellings are accepted too). Each key becomes the flag's default before the
//! command line is parsed, so the precedence is clap's own: a flag given on the command line,
//! then its `OUTBOX_LANES_*` environment variable, then the file, then the built-in default.
//! A key that names no flag is refused (exit 2), so a typo does not go unnoticed; a key for a
//! flag the command at hand does not take is ignored (one file serves `drain` and `relay`).
//! The help is rendered without the file's settings, as it hides the environment's values:
//! either may be a secret.
//!
//! The `toml` crate parses the file; only the mapping onto clap's arguments is ours.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::{ArgMatches, Command};

/// Settings that cannot come from the file: the file itself, and clap's own.
const NOT_SETTINGS: [&str; 3] = ["config", "help", "version"];

/// The config file named on the command line (`--config F`, `--config=F`) or by
/// `OUTBOX_LANES_CONFIG`, if any.
pub(crate) fn path_from(args: &[OsString]) -> Option<PathBuf> {
    let mut it = args.iter().skip(1);
    while let Some(a) = it.next() {
        let Some(s) = a.to_str() else { continue };
        if s == "--" {
            break;
        }
        if s == "--config" {
            return it.next().map(PathBuf::from);
        }
        if let Some(v) = s.strip_prefix("--config=") {
            return Some(PathBuf::from(v));
        }
    }
    std::env::var_os("OUTBOX_LANES_CONFIG")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// Parses the command line `args` with the settings of the config file (if any) as defaults.
///
/// The help names each flag's environment variable but shows neither its value nor the
/// file's: either may be a secret (a database URL's password, a token in `--on-dead-letter`,
/// the webhook secret, proxy credentials), and the help is the same wherever it is asked.
///
/// # Errors
/// A message for the user (exit 2) if the file cannot be read or parsed or names an unknown
/// setting; clap's own error (usage, `--help`, `--version`) otherwise.
pub(crate) fn matches(cmd: Command, args: Vec<OsString>) -> Result<ArgMatches, Error> {
    let cmd = without_env_values(cmd);
    let Some(path) = path_from(&args) else {
        return cmd.try_get_matches_from(args).map_err(Error::Clap);
    };
    match with_file(cmd.clone(), &path)?.try_get_matches_from(args.clone()) {
        // The file's settings are defaults, which the help prints (`[default: …]`): it is
        // rendered without them. They only add defaults, so the same arguments ask for the
        // same help.
        Err(e) if shows_help(&e) => cmd.try_get_matches_from(args).map_err(Error::Clap),
        parsed => parsed.map_err(Error::Clap),
    }
}

/// `cmd` and its subcommands with the values of their environment variables hidden from the
/// help (`[env: OUTBOX_LANES_DB]`, not `[env: OUTBOX_LANES_DB=postgres://u:pw@…]`).
fn without_env_values(cmd: Command) -> Command {
    cmd.mut_args(|a| a.hide_env_values(true))
        .mut_subcommands(without_env_values)
}

/// Whether clap's answer is a help text (`--help`, `-h`, `help`, or a command given nothing).
fn shows_help(e: &clap::Error) -> bool {
    matches!(
        e.kind(),
        clap::error::ErrorKind::DisplayHelp
            | clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    )
}

/// Why the command line could not be parsed.
#[derive(Debug)]
pub(crate) enum Error {
    /// The config file is unreadable, not TOML, or names unknown settings.
    File(String),
    /// clap's error, `--help` and `--version` included.
    Clap(clap::Error),
}

/// `cmd` with the file's settings as defaults.
fn with_file(cmd: Command, path: &Path) -> Result<Command, Error> {
    let text = read_small_file(path)
        .map_err(|e| Error::File(format!("cannot read --config {}: {e}", path.display())))?;
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        Error::File(format!(
            "--config {}: {}",
            path.display(),
            toml_error(&text, &e)
        ))
    })?;
    let mut settings = Vec::new();
    for (key, value) in &table {
        let name = key.replace('_', "-");
        if NOT_SETTINGS.contains(&name.as_str()) {
            return Err(Error::File(format!(
                "--config {}: {key:?} cannot be set in the file",
                path.display()
            )));
        }
        let values = values_of(value).ok_or_else(|| {
            Error::File(format!(
                "--config {}: {key:?} must be a string, number, boolean or an array of those",
                path.display()
            ))
        })?;
        settings.push((name, values));
    }
    let mut used = BTreeSet::new();
    let cmd = apply(cmd, &settings, &mut used);
    let unknown: Vec<&str> = settings
        .iter()
        .map(|(k, _)| k.as_str())
        .filter(|k| !used.contains(*k))
        .collect();
    if !unknown.is_empty() {
        return Err(Error::File(format!(
            "--config {}: no flag is named {} (keys are long flag names, like concurrency or \
             retry-delays; see --help)",
            path.display(),
            unknown.join(", ")
        )));
    }
    Ok(cmd)
}

/// A settings file holds at most this many bytes.
pub(crate) const MAX_FILE: u64 = 1 << 20;

/// The text of the file at `path`, if it is a regular file of at most [`MAX_FILE`] bytes
/// (a device or a pipe given by mistake would be read without end).
///
/// # Errors
/// The file cannot be read, is not a regular file, is larger or is not UTF-8.
pub(crate) fn read_small_file(path: &Path) -> std::io::Result<String> {
    outbox_lanes_tokio::sign::read_regular_file(path, MAX_FILE).map(|(text, _)| text)
}

/// A TOML error as its line, column and reason, without the text of the line: it may be a
/// secret (`webhook-secret = "…`).
pub(crate) fn toml_error(text: &str, e: &toml::de::Error) -> String {
    let reason = e.message().trim_end();
    let Some(at) = e.span().map(|s| s.start.min(text.len())) else {
        return format!("not valid TOML: {reason}");
    };
    let before = text.as_bytes().get(..at).unwrap_or_default();
    let line_start = before
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1);
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let column = String::from_utf8_lossy(&before[line_start..])
        .chars()
        .count()
        + 1;
    format!("not valid TOML at line {line}, column {column}: {reason}")
}

/// A TOML value as flag values: scalars as their text, an array as several values.
fn values_of(v: &toml::Value) -> Option<Vec<String>> {
    Some(match v {
        toml::Value::String(s) => vec![s.clone()],
        toml::Value::Integer(n) => vec![n.to_string()],
        toml::Value::Float(f) => vec![f.to_string()],
        toml::Value::Boolean(b) => vec![b.to_string()],
        toml::Value::Array(a) => {
            let mut out = Vec::with_capacity(a.len());
            for x in a {
                match x {
                    toml::Value::Array(_) | toml::Value::Table(_) => return None,
                    x => out.extend(values_of(x)?),
                }
            }
            out
        }
        toml::Value::Datetime(d) => vec![d.to_string()],
        toml::Value::Table(_) => return None,
    })
}

/// Sets the defaults of every argument of `cmd` and its subcommands named in `settings`,
/// noting the names used.
fn apply(
    mut cmd: Command,
    settings: &[(String, Vec<String>)],
    used: &mut BTreeSet<String>,
) -> Command {
    let ids: Vec<(String, String)> = cmd
        .get_arguments()
        .filter_map(|a| Some((a.get_id().to_string(), a.get_long()?.to_owned())))
        .collect();
    for (id, long) in ids {
        if let Some((_, values)) = settings.iter().find(|(k, _)| *k == long) {
            used.insert(long);
            let values = values.clone();
            cmd = cmd.mut_arg(id, move |a| a.default_values(values));
        }
    }
    let subs: Vec<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_owned())
        .collect();
    for name in subs {
        cmd = cmd.mut_subcommand(name, |s| apply(s, settings, used));
    }
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::args::{Cli, Command as Sub};
    use clap::{CommandFactory as _, FromArgMatches as _};
    use std::io::Write as _;
    use std::time::Duration;

    fn parse(file: &str, args: &[&str]) -> Result<Cli, String> {
        let mut f = tempfile::NamedTempFile::new().map_err(|e| e.to_string())?;
        f.write_all(file.as_bytes()).map_err(|e| e.to_string())?;
        let mut argv: Vec<OsString> = vec!["outbox-lanes".into(), "--config".into()];
        argv.push(f.path().as_os_str().to_owned());
        argv.extend(args.iter().map(OsString::from));
        let m = matches(Cli::command(), argv).map_err(|e| match e {
            Error::File(s) => s,
            Error::Clap(e) => e.to_string(),
        })?;
        Cli::from_arg_matches(&m).map_err(|e| e.to_string())
    }

    #[test]
    fn file_settings_are_defaults_beneath_the_command_line() {
        let file = "concurrency = 512\ntimeout = \"5s\"\nretry_delays = [\"1s\", \"3s\"]\n\
                    allow-private-destinations = true\nmax-age = \"2h\"\n";
        let Sub::Drain { delivery: d, .. } = parse(file, &["drain", "--concurrency", "7"])
            .expect("parse")
            .command
        else {
            panic!("not drain");
        };
        assert_eq!(d.concurrency, 7, "the command line wins");
        assert_eq!(d.timeout, Duration::from_secs(5));
        assert_eq!(
            d.retry_delays,
            [Duration::from_secs(1), Duration::from_secs(3)]
        );
        assert!(d.allow_private_destinations);
        assert_eq!(d.max_age, Some(Duration::from_secs(7200)));
        assert_eq!(d.max_attempts, None, "the schedule's default (12)");
        // The same file serves a command that takes none of it.
        assert!(matches!(
            parse(file, &["status"]).expect("parse").command,
            Sub::Status { .. }
        ));
    }

    #[test]
    fn bad_files_are_refused_with_their_reason() {
        let e = parse("concurency = 5\n", &["drain"]).expect_err("refused");
        assert!(e.contains("no flag is named concurency"), "{e}");
        let e = parse("concurrency = \n", &["drain"]).expect_err("refused");
        assert!(e.contains("--config"), "{e}");
        let e = parse("config = \"x\"\n", &["drain"]).expect_err("refused");
        assert!(e.contains("cannot be set"), "{e}");
        let e = parse("concurrency = 0\n", &["drain"]).expect_err("refused");
        assert!(e.contains("concurrency"), "{e}");
        let e = parse("[drain]\nconcurrency = 5\n", &["drain"]).expect_err("refused");
        assert!(e.contains("must be a string"), "{e}");
    }

    #[test]
    fn a_toml_error_says_where_without_the_line() {
        let e = parse("concurrency = 4\n  webhook-secret = \"s3cr3t\n", &["drain"])
            .expect_err("refused");
        assert!(!e.contains("s3cr3t"), "{e}");
        assert!(e.contains("at line 2, column 27: "), "{e}");
        assert_eq!(e.lines().count(), 1, "{e}");
    }

    #[test]
    fn the_help_shows_no_setting_of_the_file() {
        let file = "db = \"postgres://u:s3cr3t-db@127.0.0.1/x\"\nproxy = \"http://u:s3cr3t-proxy@p:1\"\n\
                    on-dead-letter = \"notify --token s3cr3t-cmd\"\nconcurrency = 4096\n";
        for args in [
            &["status", "--help"][..],
            &["relay", "-h"],
            &["help", "drain"],
        ] {
            let help = parse(file, args).expect_err("the help");
            assert!(help.contains("[env: OUTBOX_LANES_DB]"), "{help}");
            assert!(!help.contains("s3cr3t") && !help.contains("4096"), "{help}");
        }
    }

    #[test]
    fn only_small_regular_files_are_read() {
        let e = read_small_file(Path::new("/dev/null")).expect_err("a device");
        assert_eq!(e.to_string(), "not a regular file");
        let dir = tempfile::tempdir().expect("tempdir");
        let e = read_small_file(dir.path()).expect_err("a directory");
        assert_eq!(e.to_string(), "not a regular file");
        let path = dir.path().join("f.toml");
        let len = usize::try_from(MAX_FILE).expect("small");
        std::fs::write(&path, "#".repeat(len)).expect("write");
        assert_eq!(read_small_file(&path).expect("at the cap").len(), len);
        std::fs::write(&path, "#".repeat(len + 1)).expect("write");
        let e = read_small_file(&path).expect_err("past the cap");
        assert!(e.to_string().contains("larger than 1024 KiB"), "{e}");
    }
}
