#!/usr/bin/env bash
# bench_1b.sh: qforge against llama.cpp on a Llama-3.2-1B-shaped GGUF (random weights, vocabulary
# padded to 128256 so both load the same file), in one run, interleaved, on the same files:
#   - the PPL pass: `qforge ppl` vs `llama-perplexity -fa`, -c 512, CHUNKS chunks, -t THREADS;
#     tokens/s of the evaluation (each tool's own clock, tokenization and load excluded) and of
#     the whole command (wall);
#   - decode: `qforge generate -n 64 --temp 0` vs `llama-bench -p 0 -n 64` (tokens/s).
# Types: f16, q8_0, q4_0 (bench/gen_model_shapes) and q4_k (llama-quantize Q4_K_M from the f16).
# Every figure is the median of REPEAT runs; the two engines alternate run by run, so background
# load hits both alike. The ratios are llama.cpp time / qforge time (> 1: qforge is faster).
#
#   LLAMA_CPP_DIR=/work/llama.cpp bench/bench_1b.sh            # full: 4 types, 2 chunks, 3 repetitions
#   LLAMA_CPP_DIR=/work/llama.cpp bench/bench_1b.sh --short    # f16 + q4_0, 1 chunk, 1 repetition
# Environment: LLAMA_CPP_DIR (required; binaries in build/bin or bin), BENCH_DIR (where the model
# files go, default /tmp/qforge-bench1b; ~5 GB, kept between runs), TYPES, CHUNKS (2), REPEAT (3),
# THREADS (2), TEXT (default ../shared/data/corpora/wikitext-2-raw-test.txt), QF_BUILD (build),
# SKIP_DECODE=1, SKIP_PPL=1.
set -euo pipefail
cd "$(dirname "$0")/.."
Q=${QF_BUILD:-build}/qforge
GEN=${QF_BUILD:-build}/bench/gen_model_shapes
TYPES=${TYPES:-"f16 q8_0 q4_0 q4_k"} CHUNKS=${CHUNKS:-2} REPEAT=${REPEAT:-3} THREADS=${THREADS:-2}
if [ "${1:-}" = "--short" ]; then TYPES=${SHORT_TYPES:-"f16 q4_0"} CHUNKS=1 REPEAT=1; fi
BENCH_DIR=${BENCH_DIR:-/tmp/qforge-bench1b}
TEXT=${TEXT:-}
if [ -z "$TEXT" ]; then
    for d in ../shared/data /work/shared/data; do
        [ -f "$d/corpora/wikitext-2-raw-test.txt" ] && TEXT=$d/corpora/wikitext-2-raw-test.txt && break
    done
fi
[ -f "$TEXT" ] || { echo "bench_1b: no text (set TEXT)" >&2; exit 2; }
: "${LLAMA_CPP_DIR:?set LLAMA_CPP_DIR to a built llama.cpp tree}"
LB=""
for d in "$LLAMA_CPP_DIR/build/bin" "$LLAMA_CPP_DIR/bin"; do [ -x "$d/llama-perplexity" ] && LB=$d && break; done
[ -n "$LB" ] || { echo "bench_1b: no llama-perplexity under $LLAMA_CPP_DIR/{build/bin,bin}" >&2; exit 2; }
[ -x "$Q" ] && [ -x "$GEN" ] || make -j"$(nproc)" cli "$GEN" >/dev/null
mkdir -p "$BENCH_DIR"
case "$(cd "$BENCH_DIR" && pwd)/" in "$(pwd)"/*) echo "bench_1b: BENCH_DIR must be outside the repository" >&2; exit 2 ;; esac

model() { # the file for a type, made once
    local t=$1 f="$BENCH_DIR/llama3.2-1b-$1.gguf"
    if [ ! -s "$f" ]; then
        case "$t" in
        q4_k) "$LB/llama-quantize" "$(model f16)" "$f.tmp" Q4_K_M "$THREADS" >"$BENCH_DIR/quantize-q4_k.log" 2>&1 ;;
        *) "$GEN" --shape llama3.2-1b --type "$t" -o "$f.tmp" >/dev/null ;;
        esac
        mv "$f.tmp" "$f"
    fi
    echo "$f"
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
now() { date +%s.%N; }
# one PPL run of each engine: "eval_tok_s wall_tok_s"
qf_ppl() {
    local t0 t1 tps
    t0=$(now)
    tps=$("$Q" ppl -m "$1" -f "$TEXT" -c 512 -b 512 -t "$THREADS" --chunks "$CHUNKS" --device cpu --json 2>/dev/null |
          python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens_per_sec"])')
    t1=$(now)
    echo "$tps $(python3 -c "print($CHUNKS*512/($t1-$t0))")"
}
ll_ppl() {
    local t0 t1 tps
    t0=$(now)
    "$LB/llama-perplexity" -m "$1" -f "$TEXT" -c 512 -b 512 -t "$THREADS" --chunks "$CHUNKS" -fa >"$tmp/ll.log" 2>&1
    t1=$(now)
    # "prompt eval time = X ms / N tokens (... ms per token, T tokens per second)"
    tps=$(grep -E 'prompt eval time' "$tmp/ll.log" | sed -E 's/.*, *([0-9.]+) tokens per second.*/\1/' | tail -n 1)
    echo "${tps:-0} $(python3 -c "print($CHUNKS*512/($t1-$t0))")"
}
# one decode run: tokens/s
qf_tg() {
    "$Q" generate -m "$1" -p "The" -n 64 --temp 0 -c 512 -t "$THREADS" --device cpu 2>&1 >/dev/null |
        sed -nE 's/.*generated [0-9]+ tokens in [0-9.]+ s \(([0-9.]+) t\/s\).*/\1/p' | tail -n 1
}
ll_tg() {
    "$LB/llama-bench" -m "$1" -p 0 -n 64 -t "$THREADS" -r 1 -o csv 2>/dev/null |
        python3 -c 'import csv,sys; r=list(csv.DictReader(sys.stdin)); print(r[-1]["avg_ts"] if r else 0)'
}
med() { python3 -c "import sys,statistics as s; v=[list(map(float,l.split())) for l in sys.stdin.read().strip().splitlines()]; print(' '.join('%.3f'%s.median(c) for c in zip(*v)))"; }
ratio() { python3 -c "print('%.2f' % ($1/$2 if $2 else 0))"; }

echo "bench_1b: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); -t $THREADS, -c 512, $CHUNKS chunk(s), median of $REPEAT"
echo "$("$Q" --version 2>/dev/null | head -n 1 || true); llama.cpp: $LB"
for t in $TYPES; do model "$t" >/dev/null; done
if [ "${SKIP_PPL:-0}" != 1 ]; then
    printf '\nPPL pass (tokens/s)  %-22s %-22s %-12s\n' "qforge eval / wall" "llama.cpp eval / wall" "ratio eval / wall"
    for t in $TYPES; do
        f=$(model "$t")
        : >"$tmp/qf"; : >"$tmp/ll"
        for _ in $(seq "$REPEAT"); do qf_ppl "$f" >>"$tmp/qf"; ll_ppl "$f" >>"$tmp/ll"; done
        read -r qe qw < <(med <"$tmp/qf")
        read -r le lw < <(med <"$tmp/ll")
        printf '  %-18s %9.1f / %-10.1f %9.1f / %-10.1f %5s / %s\n' "$t" "$qe" "$qw" "$le" "$lw" "$(ratio "$qe" "$le")" "$(ratio "$qw" "$lw")"
    done
fi
if [ "${SKIP_DECODE:-0}" != 1 ]; then
    printf '\ndecode, 64 tokens (tokens/s)  %-10s %-10s %s\n' qforge llama.cpp ratio
    for t in $TYPES; do
        f=$(model "$t")
        : >"$tmp/qf"; : >"$tmp/ll"
        for _ in $(seq "$REPEAT"); do qf_tg "$f" >>"$tmp/qf"; ll_tg "$f" >>"$tmp/ll"; done
        q=$(med <"$tmp/qf"); l=$(med <"$tmp/ll")
        printf '  %-26s %-10.2f %-10.2f %s\n' "$t" "$q" "$l" "$(ratio "$q" "$l")"
    done
fi
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
