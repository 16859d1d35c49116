//! The `outbox-lanes` binary: enqueue, drain, relay and inspect an outbox from the shell.
//!
//! The interface is specified in the design (§6) and documented in `docs/cli.md` (the CLI
//! reference). Exit codes: 0 success, 1 runtime failure, 2 usage or input error.

// A write to a full or closed stdout/stderr must not panic (exit 101): `cli::say`, `print`.
#![deny(clippy::print_stderr, clippy::print_stdout)]

mod cli;

/// mimalloc, not the system allocator (the default feature `mimalloc`;
/// `--no-default-features` keeps the system allocator). Measured in one run, the same code
/// with each, alternating (BENCHMARKS.md, "The binary's allocator"): draining 100 lanes at
/// once, about a fifth less CPU per delivery (a profile put glibc's malloc and free, with its
/// chunk consolidation, at ~14 % of the process); peak RSS 1.7–2x glibc's, flat in the
/// backlog's size (1,000,000 units at 1,000 in flight: 159 MiB against 92 MiB), mimalloc's
/// v3. `MIMALLOC_ARENA_EAGER_COMMIT=0` in the environment trades most of that memory back
/// (108 MiB) for part of the gain. A service embedding the library chooses its own
/// allocator.
///
/// On Linux, `main` turns transparent huge pages off for the process first (see
/// [`no_huge_pages`]).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Transparent huge pages off for this process (`prctl(PR_SET_THP_DISABLE)`, from here on:
/// a fault never maps a 2 MiB page, whatever the allocator advised). mimalloc advises huge
/// pages for its arenas, so each arena page the relay first touches (or touches again after
/// mimalloc returned it) costs a whole 2 MiB zeroed: a profile of a drain put the kernel's
/// page zeroing at 9 % of the process. Measured with `MIMALLOC_ALLOW_THP=0` against the
/// default, alternating (BENCHMARKS.md, "Huge pages off"): peak RSS halved (100 lanes x 1,000
/// rows: 73–81 MiB against 34–37 MiB) at the same CPU per delivery. Best effort: a kernel
/// without the call keeps its own setting.
#[cfg(all(feature = "mimalloc", target_os = "linux"))]
fn no_huge_pages() {
    let _ = nix::sys::prctl::set_thp_disable(true);
}

fn main() -> std::process::ExitCode {
    #[cfg(all(feature = "mimalloc", target_os = "linux"))]
    no_huge_pages();
    cli::main()
}
