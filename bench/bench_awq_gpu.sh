#!/usr/bin/env bash
# bench_awq_gpu.sh: the AWQ learner on the CPU against the GPU, same file, same run (issue 16
# item 3). Makes a random-weight f16 model of a real shape (bench/gen_model_shapes, LAYERS of
# them: the CPU's time scales with the layers), runs
#   qforge calibrate -m FILE --artifact awq --device cpu|cuda --max-tok TOK --eval-chunks 4 --gate 0.5
# on each device and prints the learning stages calibrate reports (capture, search, block
# quantizer, write), the end-to-end wall time and the ratios CPU / GPU. --gate 0.5: random
# weights, so the gate is loose; the point is the time. Without a GPU the cuda row says so.
#
#   bench/bench_awq_gpu.sh                   # llama3-8b, 2 layers, 4096 calibration tokens
# Environment: QF_BIN (folder with qforge and gen_model_shapes; default build, build/bench),
# SHAPE (llama3-8b), LAYERS (2), TOK (4096), THREADS (all cores), MODELS_DIR (/tmp/qforge-awq-models).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${QF_BIN:-}" ]; then Q=$QF_BIN/qforge GEN=$QF_BIN/gen_model_shapes
else Q=build/qforge GEN=build/bench/gen_model_shapes; fi
SHAPE=${SHAPE:-llama3-8b} LAYERS=${LAYERS:-2} TOK=${TOK:-4096} THREADS=${THREADS:-$(nproc)}
MODELS_DIR=${MODELS_DIR:-/tmp/qforge-awq-models}
mkdir -p "$MODELS_DIR"
f=$MODELS_DIR/$SHAPE-f16-L$LAYERS.gguf
[ -f "$f" ] || "$GEN" --shape "$SHAPE" --type f16 --layers "$LAYERS" \
    --vocab-from assets/models/qforge-demo-11m-f16.gguf -o "$f" >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
declare -A learn wall
printf '%-6s %9s %9s %9s %9s %9s %10s\n' device capture search quantizer write learn "end-to-end"
for d in cpu cuda; do
    t0=$(date +%s.%N)
    if ! "$Q" calibrate -m "$f" --artifact awq --device "$d" --max-tok "$TOK" --eval-chunks 4 --gate 0.5 \
        -t "$THREADS" -o "$tmp/$d.qfa" >"$tmp/$d.out" 2>"$tmp/$d.err"; then
        printf '%-6s %s\n' "$d" "not run: $(tail -n 1 "$tmp/$d.err" | cut -c1-100)"
        continue
    fi
    t1=$(date +%s.%N)
    # "... (97.7 s: capture 47.7, search 30.4, block quantizer 7.7, write 10.9)"
    line=$(grep 'capture+learn' "$tmp/$d.err")
    read -r tl tc ts tq tw < <(sed -E 's/.*\(([0-9.]+) s: capture ([0-9.]+), search ([0-9.]+), block quantizer ([0-9.]+), write ([0-9.]+)\).*/\1 \2 \3 \4 \5/' <<<"$line")
    learn[$d]=$tl
    wall[$d]=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
    printf '%-6s %8.1fs %8.1fs %8.1fs %8.1fs %8.1fs %9.1fs\n' "$d" "$tc" "$ts" "$tq" "$tw" "$tl" "${wall[$d]}"
done
if [ -n "${learn[cpu]:-}" ] && [ -n "${learn[cuda]:-}" ]; then
    printf 'ratio CPU / GPU: learning %.1fx, end to end %.1fx (%s, %s layers, %s tokens, %s threads)\n' \
        "$(awk -v a="${learn[cpu]}" -v b="${learn[cuda]}" 'BEGIN { print a / b }')" \
        "$(awk -v a="${wall[cpu]}" -v b="${wall[cuda]}" 'BEGIN { print a / b }')" \
        "$SHAPE" "$LAYERS" "$TOK" "$THREADS"
fi
