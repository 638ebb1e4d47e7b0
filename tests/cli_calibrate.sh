#!/usr/bin/env bash
# cli_calibrate.sh: `qforge calibrate` / `qforge ppl --artifact` end to end on the embedded
# demo model and corpus with small settings: each forge failure's exit code (CorpusEmpty,
# OllamaUnavailable, CaptureFailed, CertifyFailed, PackageFailed), a certified kv-int8
# artifact that verifies and whose PPL `qforge ppl --artifact` reproduces, WrongModel on the
# q8_0 model, and SIGKILL at random moments never leaving a partial .qfa behind.
set -u
cd "$(dirname "$0")/.."
qf=${QF_BUILD:-build}/qforge
data=${QF_DATA_DIR:-../shared/data}
model=assets/models/qforge-demo-11m-f16.gguf
pass=0 fail=0 skip=0
ok() { echo "PASS $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
skp() { echo "SKIP $1"; skip=$((skip + 1)); }
if [ ! -x "$qf" ] || [ ! -f "$model" ]; then
    echo "SKIP cli_calibrate: needs $qf and $model"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
fi
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
# tiny runs: the free-baseline comparison is checked on its own below
small=(-m "$model" -c 64 --max-tok 512 --eval-chunks 2 -t 2 --allow-worse-than-baseline)

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

expect "usage: no model" 1 "$qf" calibrate --artifact kv-int8 -o "$d/x.qfa"
expect "usage: bad kind" 1 "$qf" calibrate "${small[@]}" --artifact kv-int4 -o "$d/x.qfa"
printf '  \n\n\t\n' >"$d/empty.txt"
expect "CorpusEmpty" 9 "$qf" calibrate "${small[@]}" --artifact kv-int8 --corpus "$d/empty.txt" -o "$d/x.qfa"
expect "OllamaUnavailable" 10 "$qf" calibrate "${small[@]}" --artifact kv-int8 --builtin \
    --ollama http://127.0.0.1:9 --ollama-model none -o "$d/x.qfa"
expect "CaptureFailed (fewer vectors than atoms)" 11 "$qf" calibrate "${small[@]}" --artifact kv-dict \
    --atoms 4096 --sparsity 4 -o "$d/x.qfa"
if grep -q "error: CaptureFailed: learn: layer 0 K has [0-9]* captured vectors, fewer than the 4096 atoms" "$d/err"; then
    ok "fewer vectors than atoms: the layer named once, after one 'learn:'"
else bad "fewer vectors than atoms: message"; sed 's/^/    /' "$d/err" | tail -n 3; fi
expect "CaptureFailed (--max-train below the atoms)" 11 "$qf" calibrate "${small[@]}" --artifact kv-dict \
    --atoms 64 --sparsity 4 --max-train 10 -o "$d/x.qfa"
if grep -q "error: CaptureFailed: learn: layer 0 K: kv dict learn: 10 training vectors: expected at least n_atoms = 64" "$d/err"; then
    ok "--max-train below the atoms: the first dictionary in payload order named"
else bad "--max-train below the atoms: message"; sed 's/^/    /' "$d/err" | tail -n 3; fi
expect "CertifyFailed (gate 0)" 12 "$qf" calibrate "${small[@]}" --artifact kv-dict --atoms 16 --sparsity 2 \
    --iters 1 --gate 0 -o "$d/dict.qfa"
if grep -q "did not pass its gate" "$d/err" && [ ! -e "$d/dict.qfa" ]; then ok "gate failure: numbers printed, no file"
else bad "gate failure: message or file"; fi
expect "PackageFailed (no such directory)" 13 "$qf" calibrate "${small[@]}" --artifact kv-int8 -o "$d/nodir/x.qfa"

# a certified kv-int8 artifact, verified, reproduced by qforge ppl --artifact
expect "kv-int8 certified" 0 "$qf" calibrate "${small[@]}" --artifact kv-int8 -o "$d/int8.qfa" \
    --eval-out "$d/eval.txt" --json --allow-worse-than-baseline
cand=$(sed -n 's/.*"cand_ppl": \([0-9.e+-]*\).*/\1/p' "$d/out" | head -n 1)
expect "verify" 0 "$qf" verify "$d/int8.qfa" -m "$model"
expect "ppl --artifact" 0 "$qf" ppl -m "$model" --artifact "$d/int8.qfa" -f "$d/eval.txt" -c 64 --chunks 2 -t 2 --json
got=$(sed -n 's/.*"ppl": \([0-9.e+-]*\).*/\1/p' "$d/out" | head -n 1)
if [ -n "$cand" ] && [ -n "$got" ] && awk -v a="$cand" -v b="$got" 'BEGIN { exit !((a - b) ^ 2 < (1e-9 * a) ^ 2) }'; then
    ok "ppl --artifact reproduces the certificate ($got = $cand)"
else bad "ppl --artifact reproduces the certificate ('$got' vs '$cand')"; fi
if [ -f "$data/models/qforge-demo-11m-q8_0.gguf" ]; then
    expect "WrongModel (q8_0)" 17 "$qf" ppl -m "$data/models/qforge-demo-11m-q8_0.gguf" --artifact "$d/int8.qfa" \
        -f "$d/eval.txt" -c 64 --chunks 2
else skp "WrongModel: $data/models/qforge-demo-11m-q8_0.gguf absent"; fi

# the gate against the free baseline at the same rate (q4_0 + hadamard here: 16x2 codes are
# 1.5 bits): every threshold opened, the baseline still refuses; the message names it
base=(-m "$model" -c 64 --max-tok 512 --eval-chunks 2 -t 2)
expect "CertifyFailed (worse than the free baseline)" 12 "$qf" calibrate "${base[@]}" --artifact kv-dict --atoms 16 \
    --sparsity 2 --iters 1 --gate 1e6 --max-kld 1e6 --max-kld-p99 1e6 -o "$d/dictb.qfa"
if grep -q "worse than the free baseline" "$d/err" && grep -q "q4_0+hadamard" "$d/err" && [ ! -e "$d/dictb.qfa" ]; then
    ok "baseline refusal: named, no file"
else bad "baseline refusal: message or file"; fi
expect "usage: bad --ctx" 1 "$qf" calibrate "${small[@]}" --artifact kv-int8 --ctx 64,64 -o "$d/x.qfa"
expect "usage: bad --ctx (not a list)" 1 "$qf" calibrate "${small[@]}" --artifact kv-int8 --ctx 64x -o "$d/x.qfa"

# --ctx: certified at each listed context; verify --json reports them and the rate
expect "kv-int8 --ctx 64,128" 0 "$qf" calibrate "${small[@]}" --artifact kv-int8 --ctx 64,128 -o "$d/ctx.qfa"
expect "verify --json" 0 "$qf" verify "$d/ctx.qfa" -m "$model" --json
if python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit(not (d["certified_ctx"] == [64, 128] and d["bits_per_element"] == 8.0))' "$d/out"; then
    ok "verify --json: certified_ctx [64, 128], bits_per_element 8.0"
else bad "verify --json: certified_ctx / bits_per_element: $(grep -E 'certified_ctx|bits_per' "$d/out" | tr -d '\n')"; fi
expect "ppl --artifact above the certified context" 16 "$qf" ppl -m "$model" --artifact "$d/ctx.qfa" -f "$d/eval.txt" \
    -c 256 --chunks 1 -t 2
if grep -q "largest context this artifact is certified at (128)" "$d/err"; then ok "ctx refusal names the context"
else bad "ctx refusal message"; fi
expect "ppl --force-uncertified-ctx" 0 "$qf" ppl -m "$model" --artifact "$d/ctx.qfa" -f "$d/eval.txt" -c 256 --chunks 1 \
    -t 2 --force-uncertified-ctx
if grep -q "warning: --force-uncertified-ctx" "$d/err" && grep -q "Final estimate: PPL" "$d/out"; then ok "forced: warned, ran"
else bad "forced: warning or result missing"; fi
expect "ppl --artifact at the certified context" 0 "$qf" ppl -m "$model" --artifact "$d/ctx.qfa" -f "$d/eval.txt" -c 128 \
    --chunks 1 -t 2
expect "generate above the certified context" 16 "$qf" generate -m "$model" --artifact "$d/ctx.qfa" -p "The kernel" -n 2 -c 512
expect "generate (no -c: the certified context)" 0 "$qf" generate -m "$model" --artifact "$d/ctx.qfa" -p "The kernel" -n 2 \
    --temp 0

# --kv-rot: the free baseline's flag; refused with an artifact, and for a bad name
expect "ppl q4_0 --kv-rot hadamard" 0 "$qf" ppl -m "$model" -f "$d/eval.txt" -c 64 --chunks 2 -t 2 -ctk q4_0 -ctv q4_0 \
    --kv-rot hadamard
if grep -q "^Final estimate: PPL = [0-9.]* +/- [0-9.]*$" "$d/out"; then ok "--kv-rot hadamard prints the Final estimate line"
else bad "--kv-rot hadamard: no Final estimate line"; fi
expect "usage: bad --kv-rot" 1 "$qf" ppl -m "$model" -f "$d/eval.txt" -c 64 --kv-rot walsh
expect "--kv-rot with --artifact" 1 "$qf" ppl -m "$model" --artifact "$d/ctx.qfa" -f "$d/eval.txt" -c 64 --chunks 1 \
    --kv-rot hadamard
if grep -q "kv-rot hadamard applies to the plain KV cache types" "$d/err"; then ok "--kv-rot + artifact: clear message"
else bad "--kv-rot + artifact message"; fi

# SIGKILL at random moments: the output is absent or complete and verifying
killed_ok=1 complete=0
for i in 1 2 3 4 5 6; do
    rm -f "$d/k.qfa"
    "$qf" calibrate "${small[@]}" --artifact kv-int8 -o "$d/k.qfa" >/dev/null 2>&1 &
    pid=$!
    sleep "0.$((RANDOM % 10))$((RANDOM % 10))"
    [ "$i" -ge 5 ] && sleep $((i - 4)) # the last rounds land late, near packaging
    kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    if [ -e "$d/k.qfa" ] && ! "$qf" verify "$d/k.qfa" -m "$model" >/dev/null 2>&1; then
        killed_ok=0
        echo "    round $i: a partial or bad k.qfa was left"
    elif [ -e "$d/k.qfa" ]; then complete=$((complete + 1))
    fi
done
if [ "$killed_ok" -eq 1 ]; then ok "SIGKILL never leaves a partial .qfa ($complete of 6 rounds finished a complete one)"; else bad "SIGKILL left a partial .qfa"; fi

# awq on stories260K (small and quick): the artifact names its GGUF, the certificate carries the
# RTN-Q4_0 baseline measured on the same tokens, and a failed gate removes the GGUF it wrote
s260=$data/models/stories260K.gguf
ts=$data/corpora/tinystories-sample-cs336.txt
if [ -f "$s260" ] && [ -f "$ts" ]; then
    awq=(-m "$s260" --artifact awq --corpus "$ts" -c 64 --max-tok 512 --eval-chunks 2 -t 2)
    expect "awq certified (gate 50%)" 0 "$qf" calibrate "${awq[@]}" --gate 0.5 -o "$d/awq.qfa"
    if [ -f "$d/awq.gguf" ] && "$qf" verify "$d/awq.qfa" -m "$s260" 2>/dev/null | grep -q rtn_q4_0_ppl &&
        "$qf" ppl -m "$d/awq.gguf" -f "$ts" -c 64 -t 2 >/dev/null 2>&1; then
        ok "awq: .qfa + runnable GGUF, RTN baseline in the certificate"
    else bad "awq: artifact, GGUF or RTN baseline missing"; fi
    if "$qf" verify "$d/awq.qfa" --json 2>/dev/null | grep -q '"learn_device": *"cpu"'; then
        ok "awq: the certificate records where it learned (learn_device cpu)"
    else bad "awq: learn_device missing from the certificate"; fi
    if [ ! -e /dev/nvidia0 ] && [ ! -e /dev/nvidiactl ]; then # --device cuda without a GPU: refused, nothing written
        expect "awq --device cuda without a GPU -> DeviceError" 19 "$qf" calibrate "${awq[@]}" --device cuda -o "$d/awqg.qfa"
        if [ ! -e "$d/awqg.qfa" ] && [ ! -e "$d/awqg.gguf" ]; then ok "awq --device cuda without a GPU: no files"
        else bad "awq --device cuda without a GPU: files written"; fi
    fi
    expect "awq gate 0 -> CertifyFailed" 12 "$qf" calibrate "${awq[@]}" --gate 0 -o "$d/awq0.qfa"
    if [ ! -e "$d/awq0.qfa" ] && [ ! -e "$d/awq0.gguf" ] && ! ls "$d"/awq0.gguf.* >/dev/null 2>&1; then
        ok "awq: a failed gate leaves neither .qfa nor GGUF"
    else bad "awq: files left after a failed gate"; fi
else
    skp "awq: stories260K or the cs336 sample not in $data"
fi

echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
