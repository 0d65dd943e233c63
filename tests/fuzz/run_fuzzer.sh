#!/usr/bin/env bash
# run_fuzzer.sh FUZZER SEED_CORPUS WORK_DIR SECONDS
# Runs a libFuzzer binary for SECONDS over its seed corpus (read only) and WORK_DIR/corpus (the
# inputs it finds, kept between runs), leaving its log in WORK_DIR/log and any crashing input
# in WORK_DIR. Prints one JSON line with the number of executions (also in WORK_DIR/summary.json);
# exits non-zero on a crash.
set -uo pipefail
fuzzer=$1 seeds=$2 work=$3 seconds=$4
name=$(basename "$fuzzer")
mkdir -p "$work/corpus"
"$fuzzer" -max_total_time="$seconds" -print_final_stats=1 -timeout=20 -rss_limit_mb=2048 \
  -artifact_prefix="$work/" "$work/corpus" "$seeds" >"$work/log" 2>&1
rc=$?
runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log" | tail -1)
corpus=$(find "$work/corpus" -type f | wc -l)
tail -n 5 "$work/log"
echo "{\"name\": \"$name\", \"params\": {\"seconds\": $seconds, \"corpus\": $corpus}," \
     "\"value\": ${runs:-0}, \"unit\": \"executions\", \"crashes\": $([ $rc -eq 0 ] && echo 0 || echo 1)}" |
  tee "$work/summary.json"
if [ $rc -ne 0 ]; then
  echo "$name FAILED (exit $rc); the crash report and input:" >&2
  grep -A40 -m1 -E "ERROR|FUZZ_CHECK|runtime error|deadly signal" "$work/log" >&2 || tail -n 60 "$work/log" >&2
  exit 1
fi
