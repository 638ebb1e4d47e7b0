#!/usr/bin/env bash
# make_fixtures.sh OUT_DIR QFORGE: the test data a fresh clone can make itself, laid out like
# ../shared/data so tests find it through QF_DATA_DIR (tests/run.sh uses it when there is no
# ../shared): the embedded demo model and corpus (links to assets/, the same bytes) and the
# demo model quantized to q8_0 by `qforge quantize` (llama-quantize's tensor rules; same size
# and tensor layout as shared/data's llama-quantize copy, not the same bytes: its metadata
# differs, so no test may pin its hash), and three random-weight models (below). Third-party files (stories260K, the llama.cpp vocab
# files, tinystories/wikitext) cannot be made; the tests that need them still SKIP, naming them.
# Idempotent: what exists is kept. Exit 0 when the directory is complete.
set -u
out=$1
qf=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out/models" "$out/corpora/kerneldoc-demo"
ln -sfn "$root/assets/models/qforge-demo-11m-f16.gguf" "$out/models/qforge-demo-11m-f16.gguf"
ln -sfn "$root/assets/corpora/kerneldoc-demo/docs.txt" "$out/corpora/kerneldoc-demo/docs.txt"
ln -sfn "$root/assets/corpora/kerneldoc-demo/SOURCES.txt" "$out/corpora/kerneldoc-demo/SOURCES.txt"
# random-weight models with the shapes of two files a clone cannot make (bench/gen_model_shapes):
# stories260K's (f32, head_dim 8, GQA 8/4) and qforge-demo-qwen2-5m's (qwen2: Q/K/V bias, NEOX
# rope, untied output), with the demo tokenizer; for the tests whose checks do not depend on
# trained weights (fast route vs reference, f32 rows, head_dim 8 refusals); and qwen2-5m's shape in
# llama.cpp's Q4_K_M mix (the K-format decode kernels)
gen=$(dirname "$qf")/bench/gen_model_shapes
for f in "tiny-hd8 f32 synthetic-hd8-f32" "tiny-qwen2 f16 synthetic-qwen2-f16" "tiny-qwen2 q4_k_m synthetic-qwen2-q4_k_m"; do
    set -- $f
    [ -s "$out/models/$3.gguf" ] || [ ! -x "$gen" ] ||
        "$gen" --shape "$1" --type "$2" --vocab-from "$root/assets/models/qforge-demo-11m-f16.gguf" \
            -o "$out/models/$3.gguf" >/dev/null || exit 1
done
if [ ! -s "$out/models/qforge-demo-11m-q8_0.gguf" ]; then
    "$qf" quantize "$out/models/qforge-demo-11m-f16.gguf" "$out/models/qforge-demo-11m-q8_0.gguf" q8_0 >/dev/null || exit 1
fi
exit 0
