#!/usr/bin/env bash
# bench_cert_gpu.sh: certification on the GPU in the canonical arithmetic (the CPU's bits, the
# same certificate on either device) against each device's fast arithmetic, same file, same
# run. Makes a random-weight model of a real shape (bench/gen_model_shapes), runs
#   qforge calibrate -m FILE --artifact KIND --device cuda --arith canonical|fast
# and prints the end-to-end wall time of each, the ratio, the stages calibrate reports and the
# certificates' main numbers (qforge verify). Random weights: the numbers show the route, not
# a model's quality (--gate 0.5 for awq, whose gate has no KLD bound).
#
#   bench/bench_cert_gpu.sh                  # llama3-8b q4_0, kv-int8 (docs/gpu.md "Canonical arithmetic")
#   KIND=awq TYPE=f16 LAYERS=2 bench/bench_cert_gpu.sh
# Environment: QF_BIN (folder with qforge and gen_model_shapes; default build, build/bench),
# SHAPE (llama3-8b), TYPE (q4_0), LAYERS (0 = all), KIND (kv-int8), MODELS_DIR (/tmp/qforge-cert-models).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${QF_BIN:-}" ]; then Q=$QF_BIN/qforge GEN=$QF_BIN/gen_model_shapes
else Q=build/qforge GEN=build/bench/gen_model_shapes; fi
SHAPE=${SHAPE:-llama3-8b} TYPE=${TYPE:-q4_0} LAYERS=${LAYERS:-0} KIND=${KIND:-kv-int8}
MODELS_DIR=${MODELS_DIR:-/tmp/qforge-cert-models}
mkdir -p "$MODELS_DIR"
f=$MODELS_DIR/$SHAPE-$TYPE-L$LAYERS.gguf
lay=()
[ "$LAYERS" -gt 0 ] && lay=(--layers "$LAYERS")
[ -f "$f" ] || "$GEN" --shape "$SHAPE" --type "$TYPE" "${lay[@]}" --vocab-from assets/models/qforge-demo-11m-f16.gguf \
    -o "$f" >/dev/null
gate=()
[ "$KIND" = awq ] && gate=(--gate 0.5)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
declare -A wall
for a in canonical fast; do
    t0=$(date +%s.%N)
    if ! "$Q" calibrate -m "$f" --artifact "$KIND" --device cuda --arith "$a" "${gate[@]}" -o "$tmp/$a.qfa" \
        >"$tmp/$a.out" 2>"$tmp/$a.err"; then
        echo "$a: not run: $(tail -n 1 "$tmp/$a.err" | cut -c1-160)"
        continue
    fi
    wall[$a]=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    echo "== --arith $a: ${wall[$a]} s end to end"
    grep -E '^calibrate: \[' "$tmp/$a.err" | cut -c1-200 | sed 's/^/   /'
    "$Q" verify "$tmp/$a.qfa" --json | grep -E '"(arith|ref_ppl|cand_ppl|delta_ppl|kld_mean|kld_p99|cpu_recheck_chunk0_rel_diff)"' |
        sed 's/^ */   /'
done
if [ -n "${wall[canonical]:-}" ] && [ -n "${wall[fast]:-}" ]; then
    awk -v c="${wall[canonical]}" -v f="${wall[fast]}" \
        'BEGIN { printf "canonical / fast: %.2fx the time (%s, %s, %s)\n", c / f, "'"$SHAPE"'", "'"$TYPE"'", "'"$KIND"'" }'
fi
