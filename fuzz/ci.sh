#!/usr/bin/env bash
# Builds every cargo-fuzz target of fuzz/ and runs each for a bounded time from an empty
# corpus (in a temporary directory), then replays the saved reproducers of
# fuzz/regressions/<target>/. Installs cargo-fuzz if it is missing. A finding fails the run.
#
# Without a nightly toolchain (this project's machines have one stable toolchain), the
# stable compiler is told to accept cargo-fuzz's unstable flags (RUSTC_BOOTSTRAP=1): the
# fuzz crate is a workspace of its own and nothing else is built that way.
#
# OUTBOX_LANES_FUZZ_SECONDS: seconds per target (default 20; 0 builds only).
# OUTBOX_LANES_FUZZ_TARGET_DIR: where it builds (default: $CARGO_TARGET_DIR-fuzz, or
# fuzz/target when CARGO_TARGET_DIR is not set).
set -euo pipefail

cd "$(dirname "$0")/.."

seconds="${OUTBOX_LANES_FUZZ_SECONDS:-20}"
case "$seconds" in
    '' | *[!0-9]*)
        echo "OUTBOX_LANES_FUZZ_SECONDS must be a whole number of seconds, not '$seconds'" >&2
        exit 2
        ;;
esac
if [ -n "${CARGO_TARGET_DIR:-}" ]; then
    export CARGO_TARGET_DIR="${OUTBOX_LANES_FUZZ_TARGET_DIR:-$CARGO_TARGET_DIR-fuzz}"
elif [ -n "${OUTBOX_LANES_FUZZ_TARGET_DIR:-}" ]; then
    export CARGO_TARGET_DIR="$OUTBOX_LANES_FUZZ_TARGET_DIR"
fi

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "installing cargo-fuzz"
    cargo install --locked --quiet --version 0.13.2 cargo-fuzz
fi

toolchain=()
if command -v rustup >/dev/null 2>&1 && rustup toolchain list 2>/dev/null | grep '^nightly' >/dev/null; then
    toolchain=(+nightly)
else
    export RUSTC_BOOTSTRAP=1
fi

cargo "${toolchain[@]}" fuzz build
targets=$(cargo "${toolchain[@]}" fuzz list)
echo "fuzz targets built: $(echo $targets)"
[ "$seconds" -gt 0 ] || exit 0

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for t in $targets; do
    # The corpus is thrown away; a crash input is kept in fuzz/artifacts/ (not committed).
    mkdir -p "$work/corpus/$t" "fuzz/artifacts/$t"
    # A fixed seed: the same binary explores the same inputs first, run after run. An input
    # that runs 10 s is a finding (libFuzzer's default waits 20 minutes), and the whole run
    # is bounded whatever happens.
    timeout "$((seconds + 300))" cargo "${toolchain[@]}" fuzz run "$t" "$work/corpus/$t" -- \
        -seed=1 -max_total_time="$seconds" -timeout=10 -print_final_stats=1 \
        -artifact_prefix="fuzz/artifacts/$t/" 2>"$work/$t.log" || {
        tail -n 40 "$work/$t.log"
        echo "fuzz target $t failed; its input is in fuzz/artifacts/$t/ (see the lines above)"
        exit 1
    }
    runs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$work/$t.log" | grep -o '[0-9]*$' || true)
    echo "fuzz $t: ${runs:-?} inputs in ${seconds} s, no finding"
    if [ -d "fuzz/regressions/$t" ]; then
        for f in "fuzz/regressions/$t"/*; do
            [ -f "$f" ] || continue
            cargo "${toolchain[@]}" fuzz run "$t" "$f" >"$work/$t.regression.log" 2>&1 || {
                tail -n 40 "$work/$t.regression.log"
                echo "fuzz regression $f failed"
                exit 1
            }
            echo "fuzz regression $f: passes"
        done
    fi
done
