#!/usr/bin/env bash
# cli_families.sh: the model families on the command line (tests/fixtures/families, tiny
# random-weight models written from transformers): `qforge info` names the family and its
# features; ppl, generate and a kv-int8 artifact run on them; --device cuda takes them (no family
# is refused by the CUDA backend); AWQ refuses fused tensors and MoE experts by name; an unknown architecture
# is refused naming general.architecture.
set -u
cd "$(dirname "$0")/.."
qf=${QF_BUILD:-build}/qforge
fix=tests/fixtures/families
pass=0 fail=0 skip=0
ok() { echo "PASS $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
if [ ! -x "$qf" ] || [ ! -f "$fix/gemma2.gguf" ]; then
    echo "SKIP cli_families: needs $qf and $fix"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
fi
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT

# expect NAME CODE cmd...: the exit code must be CODE
expect() {
    local name=$1 code=$2
    shift 2
    "$@" >"$d/out" 2>"$d/err"
    local rc=$?
    if [ "$rc" -eq "$code" ]; then ok "$name (exit $rc)"; else
        bad "$name: exit $rc, expected $code"
        sed 's/^/    /' "$d/err" | tail -n 5
    fi
}
has() { # has NAME FILE TEXT
    if grep -qF -- "$3" "$2"; then ok "$1"; else bad "$1: '$3' not in $2"; sed 's/^/    /' "$2" | tail -n 5; fi
}

expect "info gemma2" 0 "$qf" info "$fix/gemma2.gguf"
has "info: family and sliding window" "$d/out" "sliding window 32 (even layers)"
has "info: soft-capping" "$d/out" "attention softcap 2.5, final logit softcap 3"
expect "info gemma3" 0 "$qf" info "$fix/gemma3.gguf"
has "info: two rope bases" "$d/out" "rope base 1e+06 global / 10000 local"
expect "info mixtral" 0 "$qf" info "$fix/mixtral.gguf" --json
has "info --json: MoE" "$d/out" "llama (mixtral-style MoE)"
expect "info qwen2moe" 0 "$qf" info "$fix/qwen2moe.gguf"
has "info: shared expert" "$d/out" "shared expert (ff 64, sigmoid-gated)"
expect "info phi3" 0 "$qf" info "$fix/phi3.gguf"
has "info: fused tensors" "$d/out" "fused qkv, fused gate|up"

head -c 6000 assets/corpora/kerneldoc-demo/docs.txt >"$d/text.txt"
for f in qwen3 qwen3moe qwen2moe mixtral gemma2 gemma3 phi3; do
    expect "ppl $f" 0 "$qf" ppl -m "$fix/$f.gguf" -f "$d/text.txt" -c 128 --chunks 2 -t 2 --device auto
done
expect "generate gemma3" 0 "$qf" generate -m "$fix/gemma3.gguf" -p "hello" -n 8 -t 2 --temp 0
# --device cuda runs every family (tests/test_cuda.c checks them on a GPU): here it either runs
# (exit 0, a GPU) or fails only for want of a device (exit 19), never refusing the family
for f in gemma2 mixtral; do
    "$qf" ppl -m "$fix/$f.gguf" -f "$d/text.txt" -c 128 --chunks 1 --device cuda >"$d/out" 2>"$d/err"
    rc=$?
    if { [ "$rc" -eq 0 ] || [ "$rc" -eq 19 ]; } && ! grep -q "runs llama and qwen2 only\|no mixture-of-experts" "$d/err"; then
        ok "--device cuda: $f is not refused for its family (exit $rc)"
    else
        bad "--device cuda: $f: exit $rc: $(tail -n 1 "$d/err")"
    fi
done

expect "kv-int8 on gemma3 (sliding window, two rope bases)" 0 "$qf" calibrate -m "$fix/gemma3.gguf" -c 64 --max-tok 512 --eval-chunks 2 \
    -t 2 --allow-worse-than-baseline --artifact kv-int8 -o "$d/g3.qfa"
expect "ppl --artifact gemma3" 0 "$qf" ppl -m "$fix/gemma3.gguf" --artifact "$d/g3.qfa" -f "$d/text.txt" -c 64 --chunks 2 -t 2

expect "quantize q4_0 mixtral" 0 "$qf" quantize "$fix/mixtral.gguf" "$d/mx.gguf" q4_0
expect "awq phi3 refused" 7 "$qf" quantize "$fix/phi3.gguf" "$d/p.gguf" q4_0 --awq --builtin
has "awq phi3: names the fused tensors" "$d/err" "attn_qkv"
[ ! -e "$d/p.gguf" ] && ok "awq phi3: no output file" || bad "awq phi3: output file written"
expect "awq qwen3moe refused" 7 "$qf" quantize "$fix/qwen3moe.gguf" "$d/q.gguf" q4_0 --awq --builtin
has "awq qwen3moe: names the experts" "$d/err" "ffn_*_exps"

echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
