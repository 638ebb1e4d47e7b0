#!/usr/bin/env bash
# demo.sh: the main job on the embedded default (demo model + demo corpus).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
make -j"$(nproc)" cli >/dev/null
model=assets/models/qforge-demo-11m-f16.gguf
corpus=assets/corpora/kerneldoc-demo/docs.txt
build/qforge info "$model" | head -n 30
build/qforge ppl -m "$model" -f "$corpus" -c 512 -t "$(nproc)"
