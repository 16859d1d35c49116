#!/usr/bin/env bash
# Builds every cargo-fuzz target of fuzz/ (it does not run them). Needs a nightly toolchain
# and cargo-fuzz; without either it says so and exits 0 (nothing is installed here).
set -euo pipefail

cd "$(dirname "$0")/.."

skip() {
    echo "fuzz targets not built: no nightly toolchain / cargo-fuzz"
    exit 0
}

command -v rustup >/dev/null 2>&1 || skip
rustup toolchain list 2>/dev/null | grep -q '^nightly' || skip
cargo +nightly fuzz --version >/dev/null 2>&1 || skip

cargo +nightly fuzz build
echo "fuzz targets built: $(cargo +nightly fuzz list | tr '\n' ' ')"
