#!/usr/bin/env bash
# kv_baselines.sh: the free KV baselines every KV artifact is compared with (docs/kv-baselines.md).
# For each (model, text, context): one f32-KV reference pass saves its log-probs
# (--kl-divergence-base), then q8_0, q4_0, q4_0 + --kv-rot hadamard and q8_0 + --kv-rot hadamard
# are scored on the same tokens against it: delta PPL, mean KLD, p99 KLD, same-top-1.
#
#   bench/kv_baselines.sh [ROWSPEC...]     ROWSPEC = name:model:text:ctx:chunks
# With no ROWSPEC, the rows of docs/kv-baselines.md. Needs build/qforge and the eval split
# (qforge corpus --builtin -o $WORK/corpus). Prints markdown rows to stdout.
set -euo pipefail
QF=${QF:-build/qforge}
T=${T:-2}
WORK=${WORK:-/tmp/qf-kv-baselines}
DATA=${DATA:-../shared/data}
mkdir -p "$WORK"
[ -f "$WORK/corpus/eval.txt" ] || "$QF" corpus --builtin -o "$WORK/corpus" >/dev/null
EVAL="$WORK/corpus/eval.txt"
WIKI="$DATA/corpora/wikitext-2-raw-test.txt"
M11=assets/models/qforge-demo-11m-f16.gguf
M4K="$DATA/models/qforge-demo-11m-4k-f16.gguf"
M27="$DATA/models/qforge-demo-27m-hd128-f16.gguf"
if [ $# -eq 0 ]; then
    set -- "11m:$M11:$EVAL:512:20" "11m:$M11:$WIKI:512:20" "11m-4k:$M4K:$EVAL:4096:0" "27m-hd128:$M27:$EVAL:2048:0"
fi
num() { sed -n "s/.*\"$1\": *\([-0-9.eE+]*\).*/\1/p" "$2" | head -1; }
echo "| model | text | -c | chunks | KV | bits/elem | PPL | ΔPPL | mean KLD | p99 KLD | same top-1 |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for spec in "$@"; do
    IFS=: read -r name model text ctx chunks <<<"$spec"
    ch=(); [ "$chunks" != 0 ] && ch=(--chunks "$chunks")
    tag="$name-$(basename "$text" .txt)-$ctx"
    base="$WORK/$tag.kld"
    "$QF" ppl -m "$model" -f "$text" -c "$ctx" -t "$T" "${ch[@]}" -ctk f32 -ctv f32 --device cpu \
        --kl-divergence-base "$base" --json 2>/dev/null >"$WORK/$tag.ref.json"
    ref=$(num ppl "$WORK/$tag.ref.json")
    nch=$(num chunks "$WORK/$tag.ref.json")
    echo "| $name | $(basename "$text") | $ctx | $nch | f32 (reference) | 32 | $ref | 0 | 0 | 0 | 100 % |"
    for kv in "q8_0 none 8.5" "q8_0 hadamard 8.5" "q4_0 none 4.5" "q4_0 hadamard 4.5"; do
        read -r t rot bits <<<"$kv"
        out="$WORK/$tag.$t.$rot.json"
        "$QF" ppl -m "$model" -f "$text" -c "$ctx" -t "$T" "${ch[@]}" -ctk "$t" -ctv "$t" --kv-rot "$rot" \
            --device cpu --kl-divergence-base "$base" --kl-divergence --json 2>/dev/null >"$out"
        p=$(num ppl "$out")
        awk -v n="$name" -v tx="$(basename "$text")" -v c="$ctx" -v nc="$nch" -v t="$t" -v r="$rot" -v b="$bits" \
            -v p="$p" -v ref="$ref" -v km="$(num kld_mean "$out")" -v k99="$(num kld_p99 "$out")" \
            -v top="$(num same_top_p "$out")" 'BEGIN {
                kvn = t (r == "hadamard" ? " + hadamard" : "");
                printf "| %s | %s | %s | %s | %s | %s | %.4f | %+.3f %% | %.6f | %.5f | %.2f %% |\n",
                       n, tx, c, nc, kvn, b, p, 100 * (p - ref) / ref, km, k99, 100 * top }'
    done
done
