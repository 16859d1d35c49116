#!/usr/bin/env bash
# The library's default features are the library's: `cargo tree -e normal` of the facade
# `outbox-lanes` with its default features must list none of the binary's dependencies
# (clap, tokio, hyper, postgres, indicatif; the binary is the outbox-lanes-cli package).
#
#   .ci/lib-deps.sh                      # the check (exit 0 when clean, 1 naming the offenders)
#   .ci/lib-deps.sh --features tokio     # extra arguments go to cargo tree (this one must fail)
set -euo pipefail
cd "$(dirname "$0")/.."

forbidden=(clap clap_builder indicatif tokio hyper hyper-util postgres tokio-postgres)
crates="$(cargo tree --locked -e normal -p outbox-lanes --prefix none --format '{p}' "$@" \
    | awk '{print $1}' | sort -u)"
if [ -z "$crates" ]; then
    echo "cargo tree listed nothing" >&2
    exit 1
fi
found=()
for c in "${forbidden[@]}"; do
    if grep -qx -- "$c" <<<"$crates"; then
        found+=("$c")
    fi
done
if [ "${#found[@]}" -gt 0 ]; then
    echo "outbox-lanes ($*) depends on: ${found[*]}" >&2
    exit 1
fi
echo "outbox-lanes ($*): $(wc -l <<<"$crates") crates, none of: ${forbidden[*]}"
