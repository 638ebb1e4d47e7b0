#!/usr/bin/env bash
# cli_verify.sh: `qforge verify` against .qfa files written from scratch by Python (cbor2) and
# signed with the openssl CLI, following only docs/artifact-format.md: proves the document is
# enough to produce a file the engine accepts, and checks each refusal's exit code.
set -u
cd "$(dirname "$0")/.."
qf=${QF_BUILD:-build}/qforge
pass=0 fail=0 skip=0
ok() { echo "PASS $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
py=
for p in /usr/bin/python3 python3; do
    if $p -c 'import cbor2' 2>/dev/null; then py=$p; break; fi
done
if [ ! -x "$qf" ] || [ -z "$py" ]; then
    echo "SKIP cli_verify: needs $qf and python3 with cbor2"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
fi
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
# the model is a copy of the embedded demo model (6 layers, 2 KV heads): with -m, verify binds
# the payload to it exactly as `ppl --artifact` does, so the payload below is a valid kv-int8 one
cp "$(dirname "$0")/../assets/models/qforge-demo-11m-f16.gguf" "$d/model.gguf"

# make_qfa OUT PASSED VERSION [KEY.pem]
make_qfa() {
    "$py" - "$d/model.gguf" "$@" <<'EOF'
import cbor2, hashlib, struct, subprocess, sys
model, out, passed, version = sys.argv[1], sys.argv[2], sys.argv[3] == "1", int(sys.argv[4])
key = sys.argv[5] if len(sys.argv) > 5 else None
import os
scales = struct.pack("<12f", *([0.05] * 12))
payload = [{"name": "k_scale", "type": "f32", "shape": [6, 2], "data": scales},
           {"name": "v_scale", "type": "f32", "shape": [6, 2], "data": scales}]
pbytes = cbor2.dumps(payload)
body = cbor2.dumps({
    "kind": os.environ.get("KIND", "kv-int8"),
    "provenance": {"model_sha256": hashlib.sha256(open(model, "rb").read()).digest(),
                   "model_name": "dummy", "model_arch": "llama", "corpus_sha256": bytes(32),
                   "corpus_docs": 10, "calib_docs": 8, "eval_docs": 2, "split": "test",
                   "calib_tokens": 1000, "eval_tokens": 200, "engine_version": "0.1.0",
                   "engine_commit": "python", "config": {"bits": 8}},
    "metrics": {"ref_ppl": 10.0, "cand_ppl": 10.1, "delta_ppl": 0.01, "kld_mean": 0.001,
                "kld_p99": 0.01, "top1_agreement": 0.99},
    "gate": {"max_delta_ppl": 0.05, "max_kld": None, "min_top1": None, "passed": passed},
    "created_utc": "2025-01-01T00:00:00Z",
    "payload_sha256": hashlib.sha256(pbytes).digest(),
    "payload": payload})
head = b"QFORGEA\0" + struct.pack("<IQ", version, len(body)) + body
sig = b""
if key:
    open(out + ".msg", "wb").write(head)
    s = subprocess.run(["openssl", "pkeyutl", "-sign", "-rawin", "-inkey", key, "-in", out + ".msg"],
                       check=True, capture_output=True).stdout
    pub = subprocess.run(["openssl", "pkey", "-in", key, "-pubout", "-outform", "DER"],
                         check=True, capture_output=True).stdout[-32:]
    sig = pub + s
open(out, "wb").write(head + hashlib.sha256(head).digest() + struct.pack("<I", len(sig)) + sig)
EOF
}

# expect NAME CODE CMD...
expect() {
    local name=$1 want=$2
    shift 2
    "$@" >"$d/out" 2>&1
    local rc=$?
    if [ "$rc" -eq "$want" ]; then ok "$name"; else bad "$name (exit $rc, want $want)"; sed 's/^/    /' "$d/out"; fi
}

make_qfa "$d/ok.qfa" 1 1
make_qfa "$d/uncert.qfa" 0 1
make_qfa "$d/v99.qfa" 1 99
expect python_written_verifies 0 "$qf" verify "$d/ok.qfa"
expect model_matches 0 "$qf" verify "$d/ok.qfa" -m "$d/model.gguf"
expect wrong_model 17 "$qf" verify "$d/ok.qfa" -m "$d/ok.qfa"
expect not_certified 16 "$qf" verify "$d/uncert.qfa"
expect unknown_version 15 "$qf" verify "$d/v99.qfa"
cp "$d/ok.qfa" "$d/flip.qfa"
printf '\x00' | dd of="$d/flip.qfa" bs=1 seek=40 conv=notrunc status=none
expect corrupt 14 "$qf" verify "$d/flip.qfa"
expect missing_file 4 "$qf" verify "$d/nope.qfa"
# kind relabelled kv-int8 -> kv-dict with the checksum recomputed (unsigned): the container is
# intact, but the payload is no kv-dict payload. verify -m must refuse it with the same code
# as the loader (`ppl --artifact`), never say "verified".
KIND=kv-dict make_qfa "$d/kind.qfa" 1 1
printf 'the quick brown fox jumps over the lazy dog. %.0s' $(seq 60) >"$d/text.txt"
"$qf" ppl -m "$d/model.gguf" -f "$d/text.txt" -c 64 --chunks 1 --artifact "$d/kind.qfa" >/dev/null 2>&1
ppl_rc=$?
"$qf" verify "$d/kind.qfa" -m "$d/model.gguf" >"$d/out" 2>&1
v_rc=$?
if [ "$ppl_rc" -ne 0 ] && [ "$v_rc" -eq "$ppl_rc" ] && ! grep -q "verdict.*verified" "$d/out"; then
    ok relabelled_kind_refused_like_loader
else
    bad "relabelled_kind_refused_like_loader (verify exit $v_rc, ppl --artifact exit $ppl_rc)"; sed 's/^/    /' "$d/out"
fi
# and a valid artifact verify accepts is one ppl --artifact runs
"$qf" ppl -m "$d/model.gguf" -f "$d/text.txt" -c 64 --chunks 1 --artifact "$d/ok.qfa" >/dev/null 2>"$d/out"
rc=$?
if [ "$rc" -eq 0 ]; then ok verified_artifact_runs; else bad "verified_artifact_runs (exit $rc)"; sed 's/^/    /' "$d/out"; fi
expect usage 1 "$qf" verify

if "$qf" verify "$d/ok.qfa" --json | "$py" -c 'import json,sys; j=json.load(sys.stdin); sys.exit(0 if j["gate"]["passed"] and j["verdict"]["status"]=="Ok" and j["provenance"]["config"]=={"bits":8} else 1)'; then
    ok json_output
else
    bad json_output
fi

if openssl genpkey -algorithm ed25519 -out "$d/key.pem" 2>/dev/null &&
   openssl pkey -in "$d/key.pem" -pubout -out "$d/key.pub.pem" 2>/dev/null &&
   openssl genpkey -algorithm ed25519 -out "$d/other.pem" 2>/dev/null &&
   make_qfa "$d/signed.qfa" 1 1 "$d/key.pem" 2>"$d/err"; then
    expect signed_trusted 0 "$qf" verify "$d/signed.qfa" --trust-key "$d/key.pub.pem"
    expect signed_other_key 18 "$qf" verify "$d/signed.qfa" --trust-key "$d/other.pem"
    expect unsigned_with_trust_key 18 "$qf" verify "$d/ok.qfa" --trust-key "$d/key.pub.pem"
else
    echo "SKIP signing: openssl cannot sign with Ed25519 here: $(cat "$d/err" 2>/dev/null)"
    skip=$((skip + 1))
fi
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
