#!/usr/bin/env bash
# fuzz_long.sh [OUT_DIR] [RUNS] [MAX_SECONDS] [HARNESS...]: the long fuzzing runs
# docs/hostile-input.md records. Writes the seed corpora (tests/helpers/fuzz_seeds.sh), then runs
# every fuzz/fuzz_*.c harness (or only the HARNESS names given) one after the other, each built
# (make build-fuzz/NAME) just before it runs, with ONE job and ONE worker (-jobs=1 -workers=1)
# at nice 10 (the machine is shared), until it has done RUNS executions (default 1000000) or
# MAX_SECONDS (default 3600) have passed, whichever is first.
# One line per harness goes to OUT_DIR/summary.txt (executions, seconds, exec/s, findings);
# logs and any crashing input stay in OUT_DIR. Exit 1 when any harness found something.
set -u
cd "$(dirname "$0")/.."
out=${1:-/tmp/qforge-fuzz-long}
runs=${2:-1000000}
max=${3:-3600}
shift $(( $# < 3 ? $# : 3 ))
names=("$@")
[ ${#names[@]} -eq 0 ] && for src in fuzz/fuzz_*.c; do names+=("$(basename "$src" .c)"); done
data=${QF_DATA_DIR:-../shared/data}
mkdir -p "$out"
out=$(cd "$out" && pwd)
root=$(pwd)
tests/helpers/fuzz_seeds.sh "$out/corpus" "$data"
# fuzz_tokenizer: the three llama.cpp vocabularies that cover its paths (byte-level BPE, SPM,
# PCRE2 splits with thousands of special tokens), else the demo model's; absolute paths (the
# harness runs in its own folder)
if [ -z "${QF_FUZZ_VOCAB:-}" ]; then
    v=
    for n in gpt-2 llama-spm deepseek-llm; do
        [ -f "$data/vocab/ggml-vocab-$n.gguf" ] && v=$v${v:+:}$(realpath "$data/vocab/ggml-vocab-$n.gguf")
    done
    export QF_FUZZ_VOCAB=${v:-$root/assets/models/qforge-demo-11m-f16.gguf}
fi
status=0
: >>"$out/summary.txt"
for name in "${names[@]}"; do
    nice -n 10 make -j2 "build-fuzz/$name" >"$out/build-$name.log" 2>&1 || { echo "make build-fuzz/$name failed: $out/build-$name.log"; status=2; continue; }
    extra=()
    case $name in fuzz_tokenizer) extra=(-max_len=256) ;; fuzz_cli) extra=(-max_len=512) ;; esac
    start=$(date +%s)
    # -jobs=1 -workers=1: libFuzzer runs the one job in a child process whose output goes to
    # fuzz-0.log in the working directory (a folder per harness here)
    rm -rf "$out/run-$name" && mkdir -p "$out/run-$name"
    (cd "$out/run-$name" && QF_FUZZ_SEED_DIR=$out/corpus/$name nice -n 10 "$root/build-fuzz/$name" -jobs=1 -workers=1 \
        -runs="$runs" -max_total_time="$max" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 "${extra[@]}" \
        -artifact_prefix="$out/$name-crash-" "$out/corpus/$name") >"$out/$name.driver.log" 2>&1
    rc=$?
    cp "$out/run-$name/fuzz-0.log" "$out/$name.log" 2>/dev/null
    grep -q 'exited with exit code [1-9]' "$out/$name.driver.log" && rc=1
    secs=$(( $(date +%s) - start ))
    done_runs=$(grep -oE 'Done [0-9]+ runs' "$out/$name.log" | grep -oE '[0-9]+' | tail -n 1)
    eps=$(grep -oE 'average_exec_per_sec: *[0-9]+' "$out/$name.log" | grep -oE '[0-9]+$')
    # crash-/leak-/timeout-/oom- inputs are findings; a "slow-unit" report is not (on a busy
    # shared machine start-up alone can exceed libFuzzer's 10 s slow-unit threshold)
    findings=$(ls "$out/$name-crash-"* 2>/dev/null | grep -vc 'slow-unit')
    [ "$rc" -ne 0 ] && status=1
    printf '%s %-15s %9s executions in %5ds (%s exec/s, 1 worker), exit %d, %d findings\n' \
        "$(date -u +%FT%TZ)" "$name" "${done_runs:-?}" "$secs" "${eps:-?}" "$rc" "$findings" | tee -a "$out/summary.txt"
done
exit $status
