#!/usr/bin/env bash
# demo.sh: the main job on the embedded default (demo model + demo corpus): the forge
# calibrates and certifies a kv-int8 (8.0 bits) and a kv-rq (<= 4.0 bits) artifact (corpus ->
# capture -> learn -> certify against the f32-KV model and the free baseline at the same rate ->
# package), `qforge verify` prints their certificates, then `qforge ppl --artifact` runs the
# engine with each on the held-out evaluation text, beside the f32-KV reference and the free
# baselines llama.cpp users get (q8_0, q4_0 + Hadamard rotation). The gate is honest: an
# artifact worse than the free baseline at its rate is refused (a kv-dict at 8 bits is, see
# docs/kv-learners.md). About 2 minutes on 2 cores. Outputs in build/demo/ (or $QF_DEMO_OUT).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
make -j"$(nproc)" cli >/dev/null
qf=build/qforge
model=assets/models/qforge-demo-11m-f16.gguf
out=${QF_DEMO_OUT:-build/demo}
t=$(nproc)
mkdir -p "$out"
rm -f "$out/kv-int8.qfa" "$out/kv-rq.qfa"

echo "== calibrate kv-int8 (8.0 bits: rotated rows with per-row scales, or static per-channel scales; the better one is kept)"
$qf calibrate -m "$model" --builtin --artifact kv-int8 -t "$t" -o "$out/kv-int8.qfa" --eval-out "$out/eval.txt"
echo
echo "== calibrate kv-rq (budget 4.0 bits per element, every overhead included)"
$qf calibrate -m "$model" --builtin --artifact kv-rq --bits 4 -t "$t" -o "$out/kv-rq.qfa"
echo
for a in kv-int8 kv-rq; do
    echo "== certificate: $out/$a.qfa"
    $qf verify "$out/$a.qfa" -m "$model" | grep -v '^payload  *[kv]\.[0-9]'
    echo
done
echo "== the engine on the held-out evaluation text ($out/eval.txt, 16 chunks of 256 tokens)"
# every row in the canonical arithmetic, as certification (the artifacts' default): the same numbers on any device
ppl=("$qf" ppl -m "$model" -f "$out/eval.txt" -c 256 --chunks 16 -t "$t" --arith canonical)
echo "-- f32 KV cache (the reference)"
"${ppl[@]}" -ctk f32 -ctv f32 2>/dev/null | grep Final
echo "-- q8_0 KV (free baseline, 8.5 bits)"
"${ppl[@]}" -ctk q8_0 -ctv q8_0 2>/dev/null | grep Final
echo "-- q4_0 KV + --kv-rot hadamard (free baseline, 4.5 bits)"
"${ppl[@]}" -ctk q4_0 -ctv q4_0 --kv-rot hadamard 2>/dev/null | grep Final
for a in kv-int8 kv-rq; do
    echo "-- --artifact $out/$a.qfa"
    "${ppl[@]}" --artifact "$out/$a.qfa" 2>&1 | grep -E '^perplexity: artifact|Final'
done
