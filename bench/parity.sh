#!/usr/bin/env bash
# parity.sh: qforge ppl next to llama-perplexity on the same files, same -c, same chunks, in the
# same run; prints one row per (model, corpus) with both PPLs and their relative difference.
# The issue's bar is |diff| <= 0.3%.
#   LLAMA_CPP_DIR=/path/to/llama.cpp bench/parity.sh        # both engines
#   bench/parity.sh                                          # qforge only
# Environment: QF_DATA_DIR (default ../shared/data), CHUNKS (default 40), CTX (512), THREADS (2),
# MODELS (names without .gguf) and MODELS_DIR (default $QF_DATA_DIR/models).
set -euo pipefail
cd "$(dirname "$0")/.."
Q=${QF_BUILD:-build}/qforge
D=${QF_DATA_DIR:-../shared/data}
CHUNKS=${CHUNKS:-40} CTX=${CTX:-512} THREADS=${THREADS:-2}
[ -x "$Q" ] || make -j"$(nproc)" cli >/dev/null
llama=""
if [ -n "${LLAMA_CPP_DIR:-}" ]; then
    for d in "$LLAMA_CPP_DIR/build/bin" "$LLAMA_CPP_DIR/bin" "$LLAMA_CPP_DIR"; do
        [ -x "$d/llama-perplexity" ] && llama="$d/llama-perplexity" && break
    done
fi
models=${MODELS:-"qforge-demo-11m-f16 qforge-demo-11m-q8_0 qforge-demo-11m-q4_k_m qforge-demo-qwen2-5m-f16 qforge-demo-qwen2-5m-q4_k_m stories260K"}
MD=${MODELS_DIR:-$D/models} # e.g. MODELS_DIR=tests/fixtures/families MODELS="gemma2 phi3 mixtral"
corpora="corpora/kerneldoc-demo/docs.txt corpora/wikitext-2-raw-test.txt corpora/tinystories-sample-cs336.txt"
printf '| model | corpus | c | chunks | qforge PPL | +/- |'
[ -n "$llama" ] && printf ' llama.cpp PPL | +/- | diff |'
printf '\n|---|---|---|---|---|---|'
[ -n "$llama" ] && printf '%s' '---|---|---|'
printf '\n'
for m in $models; do
    for c in $corpora; do
        [ -f "$MD/$m.gguf" ] && [ -f "$D/$c" ] || continue
        q=$("$Q" ppl -m "$MD/$m.gguf" -f "$D/$c" -c "$CTX" -t "$THREADS" --chunks "$CHUNKS" --device cpu --json 2>/dev/null |
            python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["ppl"], j["ppl_err"], j["chunks"])' || echo "nan nan 0")
        read -r qp qe qn <<<"$q"
        printf '| %s | %s | %s | %s | %.4f | %.5f |' "$m" "$(basename "$c")" "$CTX" "$qn" "$qp" "$qe"
        if [ -n "$llama" ]; then
            l=$("$llama" -m "$MD/$m.gguf" -f "$D/$c" -c "$CTX" -b "$CTX" -t "$THREADS" --chunks "$CHUNKS" 2>&1 |
                sed -nE 's/^Final estimate: PPL = ([0-9.]+) \+\/- ([0-9.]+).*/\1 \2/p')
            if [ -n "$l" ]; then
                read -r lp le <<<"$l"
                printf ' %.4f | %.5f | %+.3f%% |' "$lp" "$le" "$(python3 -c "print(100*($qp-$lp)/$lp)")"
            else
                printf ' n/a | | |'
            fi
        fi
        printf '\n'
    done
done
