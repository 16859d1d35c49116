//! The `outbox-lanes` binary: enqueue, drain, relay and inspect an outbox from the shell.
//!
//! The interface is specified in the design (§6) and documented in `docs/cli.md` (the CLI
//! reference). Exit codes: 0 success, 1 runtime failure, 2 usage or input error.

// A write to a full or closed stdout/stderr must not panic (exit 101): `cli::say`, `print`.
#![deny(clippy::print_stderr, clippy::print_stdout)]

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
