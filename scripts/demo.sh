#!/usr/bin/env bash
# demo.sh: the main job on the embedded default (demo model + demo corpus): the forge
# calibrates and certifies a kv-int8 and a kv-dict artifact (corpus -> capture -> learn ->
# certify -> package), `qforge verify` prints their certificates, then `qforge ppl --artifact`
# runs the engine with each on the held-out evaluation text, beside the f32-KV baseline.
# About 2-3 minutes on 2 cores. Outputs in build/demo/ (or $QF_DEMO_OUT).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
make -j"$(nproc)" cli >/dev/null
qf=build/qforge
model=assets/models/qforge-demo-11m-f16.gguf
out=${QF_DEMO_OUT:-build/demo}
t=$(nproc)
mkdir -p "$out"
rm -f "$out/kv-int8.qfa" "$out/kv-dict.qfa"

echo "== calibrate kv-int8 (static per-channel / per-head scales; the better one is kept)"
$qf calibrate -m "$model" --builtin --artifact kv-int8 -t "$t" -o "$out/kv-int8.qfa" --eval-out "$out/eval.txt"
echo
echo "== calibrate kv-dict (256 atoms, 32 nonzeros, 8-bit coefficients per K/V vector)"
$qf calibrate -m "$model" --builtin --artifact kv-dict --atoms 256 --sparsity 32 --coef q8 --iters 4 \
    --max-train 2048 --max-tok 4096 -t "$t" -o "$out/kv-dict.qfa"
echo
for a in kv-int8 kv-dict; do
    echo "== certificate: $out/$a.qfa"
    $qf verify "$out/$a.qfa" -m "$model" | grep -v '^payload  *[kv]\.[0-9]'
    echo
done
echo "== the engine on the held-out evaluation text ($out/eval.txt, 16 chunks of 256 tokens)"
echo "-- f32 KV cache (the reference)"
$qf ppl -m "$model" -f "$out/eval.txt" -c 256 --chunks 16 -t "$t" -ctk f32 -ctv f32 2>/dev/null | grep Final
for a in kv-int8 kv-dict; do
    echo "-- --artifact $out/$a.qfa"
    $qf ppl -m "$model" --artifact "$out/$a.qfa" -f "$out/eval.txt" -c 256 --chunks 16 -t "$t" 2>&1 |
        grep -E '^perplexity: artifact|Final'
done
