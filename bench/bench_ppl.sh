#!/usr/bin/env bash
# bench_ppl.sh: perplexity-evaluation throughput of qforge for the demo model at f16, q8_0 and
# q4_0 (-t 2 -c 512), and, when LLAMA_CPP_DIR points at a built llama.cpp, llama-perplexity's
# throughput on the same files in the same run, with the ratio qforge / llama.cpp.
# The q8_0 / q4_0 files are made with `qforge quantize` (round to nearest; byte-identical to
# llama-quantize's for these types) into a temporary directory. Runs alternate between the two
# engines and each figure is the best of REPEAT runs, so background load hits both alike.
#
#   bench/bench_ppl.sh                       # qforge only
#   LLAMA_CPP_DIR=/path/to/llama.cpp bench/bench_ppl.sh
# Environment: CHUNKS (default 8), THREADS (2), CTX (512), REPEAT (3), QF_BUILD (build).
set -euo pipefail
cd "$(dirname "$0")/.."
Q=${QF_BUILD:-build}/qforge
CHUNKS=${CHUNKS:-8} THREADS=${THREADS:-2} CTX=${CTX:-512} REPEAT=${REPEAT:-3}
text=assets/corpora/kerneldoc-demo/docs.txt
f16=assets/models/qforge-demo-11m-f16.gguf
[ -x "$Q" ] || make -j"$(nproc)" cli >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$Q" quantize "$f16" "$tmp/q8_0.gguf" q8_0 >/dev/null
"$Q" quantize "$f16" "$tmp/q4_0.gguf" q4_0 >/dev/null
llama=""
if [ -n "${LLAMA_CPP_DIR:-}" ]; then
    for d in "$LLAMA_CPP_DIR/build/bin" "$LLAMA_CPP_DIR/bin" "$LLAMA_CPP_DIR"; do
        [ -x "$d/llama-perplexity" ] && llama="$d/llama-perplexity" && break
    done
    [ -n "$llama" ] || echo "bench_ppl: no llama-perplexity under $LLAMA_CPP_DIR; measuring qforge only" >&2
fi

# tokens/s of the evaluation (excluding load and tokenization) and of the whole command
qf_run() {
    local t0 t1 tps
    t0=$(date +%s.%N)
    tps=$("$Q" ppl -m "$1" -f "$text" -c "$CTX" -b "$CTX" -t "$THREADS" --chunks "$CHUNKS" --json 2>/dev/null |
          python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens_per_sec"])')
    t1=$(date +%s.%N)
    echo "$tps $(python3 -c "print($CHUNKS*$CTX/($t1-$t0))")"
}
ll_run() {
    local t0 t1 log tps
    log="$tmp/llama.log"
    t0=$(date +%s.%N)
    "$llama" -m "$1" -f "$text" -c "$CTX" -b "$CTX" -t "$THREADS" --chunks "$CHUNKS" >"$log" 2>&1
    t1=$(date +%s.%N)
    # "prompt eval time = X ms / N tokens (... ms per token, T tokens per second)"
    tps=$(grep -E 'prompt eval time' "$log" | sed -E 's/.*, *([0-9.]+) tokens per second.*/\1/' | tail -n 1)
    echo "${tps:-0} $(python3 -c "print($CHUNKS*$CTX/($t1-$t0))")"
}
best() { python3 -c "import sys; v=[l.split() for l in sys.stdin.read().strip().splitlines()]; print(max(float(x[0]) for x in v), max(float(x[1]) for x in v))"; }

printf '%-6s %14s %14s' type qforge_eval qforge_wall
[ -n "$llama" ] && printf ' %14s %14s %8s %8s' llama_eval llama_wall ratio_ev ratio_wall
printf '   (tokens/s, -t %s -c %s, %s chunks, best of %s)\n' "$THREADS" "$CTX" "$CHUNKS" "$REPEAT"
for type in f16 q8_0 q4_0; do
    m=$f16; [ "$type" = f16 ] || m="$tmp/$type.gguf"
    : >"$tmp/qf" ; : >"$tmp/ll"
    for _ in $(seq "$REPEAT"); do
        qf_run "$m" >>"$tmp/qf"
        [ -n "$llama" ] && ll_run "$m" >>"$tmp/ll"
    done
    read -r qe qw < <(best <"$tmp/qf")
    printf '%-6s %14.1f %14.1f' "$type" "$qe" "$qw"
    if [ -n "$llama" ]; then
        read -r le lw < <(best <"$tmp/ll")
        printf ' %14.1f %14.1f %8.2f %8.2f' "$le" "$lw" "$(python3 -c "print($qe/$le if $le else 0)")" \
            "$(python3 -c "print($qw/$lw if $lw else 0)")"
    fi
    printf '\n'
done
