#!/usr/bin/env bash
# bench_gpu_llamacpp.sh: qforge's CUDA backend against llama.cpp's CUDA build on the same GGUF
# files, in one run (issue 16 item 4). For each type (f16, q4_0, q4_k_m) of a random-weight model of a real
# shape (bench/gen_model_shapes; vocabulary padded to the embedding so that llama.cpp loads it):
#   PPL pass   `qforge ppl -c 512 -b 512 --chunks CHUNKS --device cuda` (its own evaluation clock)
#              vs `llama-perplexity -ngl 99 -fa -c 512 -b 512 --chunks CHUNKS` (prompt eval clock);
#   prefill    bench_gpu's prefill of 512-token chunks (last logits) vs `llama-bench -p 512 -n 0`;
#   decode     bench_gpu's 128 single-token steps from position 1 vs `llama-bench -p 0 -n 128`
#              (tg128), each step's logits copied to the host in both.
# Every figure is tokens/s; ratio = qforge / llama.cpp (> 1: qforge faster).
#
#   LLAMA_CPP_DIR=/path/to/llama.cpp bench/bench_gpu_llamacpp.sh
# Environment: LLAMA_CPP_DIR (required: llama-bench and llama-perplexity in build/bin or bin, a
# CUDA build), QF_BIN (folder with qforge, bench_gpu, gen_model_shapes; default build with
# build/bench), MODELS_DIR (where the files are made once, default /tmp/qforge-gpu-models, ~26 GB
# for the 8B shape), SHAPE (llama3-8b), TYPES ("f16 q4_0 q4_k_m"), CHUNKS (8), TEXT (default the demo
# corpus assets/corpora/kerneldoc-demo/docs.txt), OUT (a folder for the logs, default a temp dir).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${LLAMA_CPP_DIR:?set LLAMA_CPP_DIR to a llama.cpp tree built with -DGGML_CUDA=ON}"
LB=""
for d in "$LLAMA_CPP_DIR/build/bin" "$LLAMA_CPP_DIR/bin"; do [ -x "$d/llama-bench" ] && LB=$d && break; done
[ -n "$LB" ] || { echo "bench_gpu_llamacpp: no llama-bench under $LLAMA_CPP_DIR/{build/bin,bin}" >&2; exit 2; }
if [ -n "${QF_BIN:-}" ]; then Q=$QF_BIN/qforge BG=$QF_BIN/bench_gpu GEN=$QF_BIN/gen_model_shapes
else Q=build/qforge BG=build/bench/bench_gpu GEN=build/bench/gen_model_shapes; fi
SHAPE=${SHAPE:-llama3-8b} TYPES=${TYPES:-"f16 q4_0 q4_k_m"} CHUNKS=${CHUNKS:-8}
TEXT=${TEXT:-assets/corpora/kerneldoc-demo/docs.txt}
MODELS_DIR=${MODELS_DIR:-/tmp/qforge-gpu-models}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$MODELS_DIR" "$OUT"
rows=()
for t in $TYPES; do
    f=$MODELS_DIR/$SHAPE-$t.gguf
    [ -s "$f" ] || { "$GEN" --shape "$SHAPE" --type "$t" -o "$f.tmp" >/dev/null && mv "$f.tmp" "$f"; }
    # qforge
    "$Q" ppl -m "$f" -f "$TEXT" -c 512 -b 512 --chunks "$CHUNKS" --device cuda --json >"$OUT/qf-ppl-$t.json" 2>"$OUT/qf-ppl-$t.err"
    "$BG" "$f" --corpus "$TEXT" --chunks "$CHUNKS" -c 512 --prefill-only >"$OUT/qf-prefill-$t.log" 2>&1
    "$BG" "$f" --chunks 1 -c 512 --decode-only --decode-pos 1 --decode-steps 128 >"$OUT/qf-decode-$t.log" 2>&1
    # llama.cpp
    "$LB/llama-perplexity" -m "$f" -f "$TEXT" -ngl 99 -fa -c 512 -b 512 --chunks "$CHUNKS" >"$OUT/lc-ppl-$t.log" 2>&1
    "$LB/llama-bench" -m "$f" -ngl 99 -fa 1 -p 512 -n 0 -r 3 -o csv >"$OUT/lc-pp-$t.csv" 2>"$OUT/lc-pp-$t.err"
    "$LB/llama-bench" -m "$f" -ngl 99 -fa 1 -p 0 -n 128 -r 3 -o csv >"$OUT/lc-tg-$t.csv" 2>"$OUT/lc-tg-$t.err"
    rows+=("$t")
done
python3 - "$OUT" "${rows[@]}" <<'PY'
import csv, json, re, sys
out, types = sys.argv[1], sys.argv[2:]
def rd(p):
    with open(p, errors="replace") as f: return f.read()
def lb(p):
    rows = list(csv.DictReader(l for l in open(p) if l.strip()))
    return float(rows[-1]["avg_ts"]) if rows else float("nan")
def grab(p, pat):
    m = re.search(pat, rd(p))
    return float(m.group(1)) if m else float("nan")
print("| %s | qforge tok/s | llama.cpp tok/s | ratio |" % "measurement")
print("|---|---|---|---|")
for t in types:
    qp = json.load(open(f"{out}/qf-ppl-{t}.json"))["tokens_per_sec"]
    lp = grab(f"{out}/lc-ppl-{t}.log", r"prompt eval time =.*?([0-9.]+) tokens per second")
    qpre = grab(f"{out}/qf-prefill-{t}.log", r"prefill \(last logits\):\s+([0-9.]+) tok/s")
    qdec = grab(f"{out}/qf-decode-{t}.log", r"decode \(1 token/step\):\s+([0-9.]+) tok/s")
    for name, q, l in ((f"PPL pass, {t}", qp, lp), (f"prefill pp512, {t}", qpre, lb(f"{out}/lc-pp-{t}.csv")),
                       (f"decode tg128, {t}", qdec, lb(f"{out}/lc-tg-{t}.csv"))):
        print(f"| {name} | {q:,.1f} | {l:,.1f} | {q / l:.2f}x |")
PY
echo "logs: $OUT"
