#!/usr/bin/env bash
# kv_rq.sh: the kv-rq table of docs/kv-rq.md. For one model and context: calibrate kv-rq
# artifacts at the given budgets on the embedded kerneldoc corpus (its calibration split), then on
# the held-out evaluation split (and optionally a second text) measure against the f32-KV
# reference: PPL, mean / p99 KLD and same-top-1 of each artifact and of the free baselines
# (q4_0, q8_0 and, when the build has it, q4_0 + --kv-rot hadamard).
#   bench/kv_rq.sh MODEL CTX "4.0 2.5" [EXTRA_TEXT] [CHUNKS] [CALIBRATE_ARGS...]
set -u
cd "$(dirname "$0")/.."
qf=${QF_BUILD:-build}/qforge
qfb=${QF_BASELINE_BIN:-$qf} # a build with --kv-rot (until this branch has it from main)
model=$1 ctx=$2 budgets=$3 extra=${4:-} chunks=${5:-16}
shift 5 2>/dev/null || shift $#
cal_args=("$@")
out=${QF_BENCH_OUT:-/tmp/kv_rq_bench}
mkdir -p "$out"
tag=$(basename "$model" .gguf)-c$ctx
t=${QF_THREADS:-2}
row() { # name bits text ppl-args... (QF_ROW_BIN: the binary)
    local name=$1 bits=$2 text=$3
    shift 3
    "${QF_ROW_BIN:-$qf}" ppl -m "$model" -f "$text" -c "$ctx" --chunks "$chunks" -t "$t" --kl-divergence-base "$out/$tag.$(basename "$text").base" \
        --kl-divergence --json "$@" 2>/dev/null >"$out/row.json" || { echo "| $name | $bits | (failed) |"; return; }
    python3 - "$out/row.json" "$name" "$bits" "$refppl" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); ref = float(sys.argv[4])
print("| %s | %s | %.4f | %+.3f%% | %.5f | %.4f | %.2f%% |" % (sys.argv[2], sys.argv[3], r["ppl"], 100 * (r["ppl"] - ref) / ref,
      r["kld_mean"], r["kld_p99"], 100 * r["same_top_p"]))
PY
}
for b in $budgets; do
    "$qf" calibrate -m "$model" --artifact kv-rq --bits "$b" -c "$ctx" -t "$t" -o "$out/$tag.rq$b.qfa" "${cal_args[@]}" \
        --eval-out "$out/$tag.eval.txt" >"$out/$tag.rq$b.log" 2>&1 || echo "calibrate --bits $b failed: $(tail -n 1 "$out/$tag.rq$b.log")"
done
for text in "$out/$tag.eval.txt" $extra; do
    "$qf" ppl -m "$model" -f "$text" -c "$ctx" --chunks "$chunks" -t "$t" -ctk f32 -ctv f32 \
        --kl-divergence-base "$out/$tag.$(basename "$text").base" --json 2>/dev/null >"$out/ref.json"
    refppl=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["ppl"])' "$out/ref.json")
    echo "### $(basename "$model") -c $ctx on $(basename "$text") ($chunks chunks), f32-KV reference PPL $refppl"
    echo "| KV cache | bits/element | PPL | ΔPPL | mean KLD | p99 KLD | same top-1 |"
    echo "|---|---|---|---|---|---|---|"
    row "q8_0" 8.5 "$text" -ctk q8_0 -ctv q8_0
    row "q4_0" 4.5 "$text" -ctk q4_0 -ctv q4_0
    if "$qfb" ppl --help 2>&1 | grep -q -- --kv-rot; then
        QF_ROW_BIN=$qfb row "q4_0 + --kv-rot hadamard" 4.5 "$text" -ctk q4_0 -ctv q4_0 --kv-rot hadamard
    fi
    for b in $budgets; do
        [ -f "$out/$tag.rq$b.qfa" ] || continue
        bpe=$(sed -n 's/.*kv-rq .*: \([0-9.]*\) bits\/element.*/\1/p' "$out/$tag.rq$b.log" | tail -n 1)
        row "kv-rq --bits $b ($(sed -n 's/.*kv-rq \(K [0-9]* V [0-9]* S[0-9]* R[0-9]*\).*/\1/p' "$out/$tag.rq$b.log" | tail -n 1))" "$bpe" "$text" --artifact "$out/$tag.rq$b.qfa"
    done
done
