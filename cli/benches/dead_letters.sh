#!/usr/bin/env bash
# Dead-lettering through the binary: policy-refused units per second, old binary against new,
# alternating, in one run.
#
#   cli/benches/dead_letters.sh OLD_BIN NEW_BIN [ROUNDS]
#
# Each case enqueues 10,000 rows to 127.0.0.1 with `enqueue --allow-private-destinations` into
# a fresh SQLite file (default settings: WAL, synchronous=FULL), then times `drain` without
# that flag: every unit is dead-lettered `destination_refused` and no HTTP request is made.
# Cases: one lane of 10,000 rows, and 100 lanes of 100 rows (rows interleaved across lanes).
# Each drain is checked: 0 pending, 10,000 dead letters. Printed per drain: units/s over the
# drain's wall time, and its user + system CPU seconds. ROUNDS (default 3) runs of each binary
# per case, old and new alternating. Logging is the default (INFO, one line per dead letter),
# to a file. DL_HOST=localhost sends the rows to a host name instead of the IP literal (the
# guard then refuses what the name resolves to; nothing is sent either way).
set -euo pipefail

old=${1:?usage: dead_letters.sh OLD_BIN NEW_BIN [ROUNDS]}
new=${2:?usage: dead_letters.sh OLD_BIN NEW_BIN [ROUNDS]}
rounds=${3:-3}
units=10000
host=${DL_HOST:-127.0.0.1}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

# One lane: 10,000 rows to one inbox. 100 lanes: row i goes to inbox i % 100.
awk -v n=$units -v h="$host" 'BEGIN { for (i = 0; i < n; i++)
  printf "{\"id\":\"r%d\",\"to\":[\"http://%s:9/inbox\"],\"body\":{\"n\":%d}}\n", i, h, i }' \
  >"$dir/one.jsonl"
awk -v n=$units -v h="$host" 'BEGIN { for (i = 0; i < n; i++)
  printf "{\"id\":\"r%d\",\"to\":[\"http://%s:9/inbox%d\"],\"body\":{\"n\":%d}}\n", i, h, i % 100, i }' \
  >"$dir/many.jsonl"

run() { # binary label case
  local bin=$1 label=$2 case=$3 db="$dir/$2-$3.db"
  rm -rf "$db" "$db"-*
  "$bin" --db "$db" enqueue --actor bench --allow-private-destinations <"$dir/$case.jsonl" \
    >/dev/null 2>"$dir/enqueue.log"
  local t0 t1 cpu
  TIMEFORMAT='%U %S'
  t0=$(date +%s.%N)
  cpu=$({ time "$bin" --db "$db" drain --no-progress >/dev/null 2>"$dir/drain.log"; } 2>&1)
  t1=$(date +%s.%N)
  local status
  status=$("$bin" --db "$db" status --json)
  grep -q '"pending": 0' <<<"$status" || { echo "$label $case: units left pending" >&2; exit 1; }
  grep -q "\"dead_letters\": $units" <<<"$status" || { echo "$label $case: not $units dead letters" >&2; exit 1; }
  awk -v l="$label" -v c="$case" -v n=$units -v a="$t0" -v b="$t1" -v cpu="$cpu" 'BEGIN {
    split(cpu, t, " "); w = b - a
    printf "%-4s %-9s %8.0f units/s  %6.2f s wall  %5.2f s CPU\n", l, c == "one" ? "1 lane" : "100 lanes", n / w, w, t[1] + t[2] }'
}

echo "old: $old"
echo "new: $new"
for case in one many; do
  for ((r = 1; r <= rounds; r++)); do
    run "$old" old "$case"
    run "$new" new "$case"
  done
done
