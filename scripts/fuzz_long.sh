#!/usr/bin/env bash
# fuzz_long.sh [OUT_DIR] [RUNS] [MAX_SECONDS]: the long fuzzing runs docs/fuzzing.md records.
# Builds the harnesses (make fuzz), writes the seed corpora (tests/helpers/fuzz_seeds.sh), then
# runs every fuzz/fuzz_*.c harness one after the other with ONE worker until it has done RUNS
# executions (default 1000000) or MAX_SECONDS (default 3600) have passed, whichever is first.
# One line per harness goes to OUT_DIR/summary.txt (executions, seconds, exec/s, findings);
# logs and any crashing input stay in OUT_DIR. Exit 1 when any harness found something.
set -u
cd "$(dirname "$0")/.."
out=${1:-/tmp/qforge-fuzz-long}
runs=${2:-1000000}
max=${3:-3600}
data=${QF_DATA_DIR:-../shared/data}
mkdir -p "$out"
make -j2 fuzz >"$out/build.log" 2>&1 || { echo "make fuzz failed: $out/build.log"; exit 2; }
tests/helpers/fuzz_seeds.sh "$out/corpus" "$data"
[ -z "${QF_FUZZ_VOCAB:-}" ] && [ -f "$data/vocab/ggml-vocab-gpt-2.gguf" ] && export QF_FUZZ_VOCAB=$data/vocab/ggml-vocab-gpt-2.gguf
status=0
: >"$out/summary.txt"
for src in fuzz/fuzz_*.c; do
    name=$(basename "$src" .c)
    extra=()
    case $name in fuzz_tokenizer) extra=(-max_len=256) ;; fuzz_cli) extra=(-max_len=512) ;; esac
    start=$(date +%s)
    QF_FUZZ_SEED_DIR=$out/corpus/$name build-fuzz/$name -runs="$runs" -max_total_time="$max" -timeout=10 \
        -rss_limit_mb=2048 -print_final_stats=1 "${extra[@]}" -artifact_prefix="$out/$name-crash-" \
        "$out/corpus/$name" >"$out/$name.log" 2>&1
    rc=$?
    secs=$(( $(date +%s) - start ))
    done_runs=$(grep -oE 'Done [0-9]+ runs' "$out/$name.log" | grep -oE '[0-9]+' | tail -n 1)
    eps=$(grep -oE 'average_exec_per_sec: *[0-9]+' "$out/$name.log" | grep -oE '[0-9]+$')
    # crash-/leak-/timeout-/oom- inputs are findings; a "slow-unit" report is not (on a busy
    # shared machine start-up alone can exceed libFuzzer's 10 s slow-unit threshold)
    findings=$(ls "$out/$name-crash-"* 2>/dev/null | grep -vc 'slow-unit')
    [ "$rc" -ne 0 ] && status=1
    printf '%-15s %9s executions in %5ds (%s exec/s, 1 worker), exit %d, %d findings\n' \
        "$name" "${done_runs:-?}" "$secs" "${eps:-?}" "$rc" "$findings" | tee -a "$out/summary.txt"
done
exit $status
