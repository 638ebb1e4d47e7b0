#!/usr/bin/env bash
# make_fixtures.sh OUT_DIR QFORGE: the test data a fresh clone can make itself, laid out like
# ../shared/data so tests find it through QF_DATA_DIR (tests/run.sh uses it when there is no
# ../shared): the embedded demo model and corpus (links to assets/, the same bytes) and the
# demo model quantized to q8_0 by `qforge quantize` (llama-quantize's tensor rules; same size
# and tensor layout as shared/data's llama-quantize copy, not the same bytes: its metadata
# differs, so no test may pin its hash). Third-party files (stories260K, the llama.cpp vocab
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
if [ ! -s "$out/models/qforge-demo-11m-q8_0.gguf" ]; then
    "$qf" quantize "$out/models/qforge-demo-11m-f16.gguf" "$out/models/qforge-demo-11m-q8_0.gguf" q8_0 >/dev/null || exit 1
fi
exit 0
