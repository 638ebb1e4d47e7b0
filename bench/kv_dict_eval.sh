#!/usr/bin/env bash
# kv_dict_eval.sh: KV-cache compression vs the f32-KV model on one text, the numbers of
# docs/kv-dict-v2.md. One reference run (f32 K and V, log-probs saved), then every
# candidate on the same chunks: bits per element (every overhead the cache stores), mean /
# p99 KLD, delta PPL, same-top-1.
#
#   bench/kv_dict_eval.sh MODEL TEXT CTX CHUNKS CAND...
#   CAND: a KV type pair "q4_0" / "q8_0" / "f16" (-ctk T -ctv T), "T+rot" (adds --kv-rot
#         hadamard, when the build has it), or a .qfa artifact path.
# Runs on the CPU with 2 threads (QF_THREADS to change). Prints one markdown row per candidate.
# QF_REF_DIR=DIR keeps the reference run (ref.kld, ref.json) there and reuses it when present,
# so candidates can be added later against the same reference.
set -euo pipefail
qf=${QF:-build/qforge}
model=$1 text=$2 ctx=$3 chunks=$4
shift 4
t=${QF_THREADS:-2}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ref=${QF_REF_DIR:-$tmp}
mkdir -p "$ref"
common=(-m "$model" -f "$text" -c "$ctx" --chunks "$chunks" -t "$t" --device cpu --json)
if [ ! -s "$ref/ref.json" ] || [ ! -s "$ref/ref.kld" ]; then
    "$qf" ppl "${common[@]}" -ctk f32 -ctv f32 --kl-divergence-base "$ref/ref.kld" >"$ref/ref.json" 2>/dev/null
fi
echo "| candidate | bits/elem | PPL | dPPL | mean KLD | p99 KLD | same top-1 |"
echo "|---|---|---|---|---|---|---|"
for c in "$@"; do
    case "$c" in
    *.qfa) args=(--artifact "$c") ;;
    *+rot) args=(-ctk "${c%+rot}" -ctv "${c%+rot}" --kv-rot hadamard) ;;
    *) args=(-ctk "$c" -ctv "$c") ;;
    esac
    if ! "$qf" ppl "${common[@]}" "${args[@]}" --kl-divergence-base "$ref/ref.kld" --kl-divergence \
        >"$tmp/c.json" 2>"$tmp/c.err"; then
        echo "| $c | (failed: $(tail -1 "$tmp/c.err")) |||||"
        continue
    fi
    python3 - "$ref/ref.json" "$tmp/c.json" "$c" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); c = json.load(open(sys.argv[2]))
name = sys.argv[3]
# the f32 reference stores 4 bytes per element: elements per token = its bytes / 4
bits = "%.3f" % (c["kv_bytes_per_token"] * 8 / (r["kv_bytes_per_token"] / 4))
ppl, rp = c["ppl"], r["ppl"]
print("| %s | %s | %.4f | %+.3f%% | %.5f | %.4f | %.2f%% |" % (name, bits, ppl, 100 * (ppl - rp) / rp,
      c["kld_mean"], c["kld_p99"], 100 * c["same_top_p"]))
PY
done
