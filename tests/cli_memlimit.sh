#!/usr/bin/env bash
# cli_memlimit.sh: under an address-space limit (ulimit -v 200 MB, 500 MB, 1 GB) `info`,
# `verify -m`, `ppl` and `generate` on the embedded demo model finish within seconds, either
# working or with a clear OutOfMemory error (exit 5): never a hang (OpenBLAS used to retry a
# failed 128 MiB buffer forever), never a crash. Uses whatever build $QF_BUILD holds; when that
# binary links the CUDA libraries (they alone exceed 200 MB of address space) the 200 MB case is
# skipped with the reason (and the 500 MB case: the loader cannot map libcublasLt either). Skipped under ASan (its shadow memory needs terabytes of address space).
set -u
cd "$(dirname "$0")/.."
qf=${QF_BUILD:-build}/qforge
pass=0 fail=0 skip=0
ok() { echo "PASS $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
if [ -n "${QF_ASAN:-}" ]; then
    echo "SKIP memlimit: ASan reserves terabytes of address space; ulimit -v cannot apply"
    echo "0 passed, 0 failed, 1 skipped"; exit 0
fi
if [ ! -x "$qf" ]; then echo "SKIP memlimit: $qf not built"; echo "0 passed, 0 failed, 1 skipped"; exit 0; fi
M=assets/models/qforge-demo-11m-f16.gguf
T=assets/corpora/kerneldoc-demo/docs.txt
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
# an artifact for the demo model (kv-int8, 6 layers x 2 KV heads) when cbor2 is there, else a
# damaged one (verify then stops at the container, before the model)
py=python3
/usr/bin/python3 -c 'import cbor2' 2>/dev/null && py=/usr/bin/python3
"$py" - "$M" "$d/a.qfa" <<'PY' 2>/dev/null || printf 'QFORGEA\0damaged' >"$d/a.qfa"
import cbor2, hashlib, struct, sys
scales = struct.pack("<12f", *([0.05] * 12))
payload = [{"name": "k_scale", "type": "f32", "shape": [6, 2], "data": scales},
           {"name": "v_scale", "type": "f32", "shape": [6, 2], "data": scales}]
body = cbor2.dumps({"kind": "kv-int8",
    "provenance": {"model_sha256": hashlib.sha256(open(sys.argv[1], "rb").read()).digest(), "model_name": "demo",
                   "model_arch": "llama", "corpus_sha256": bytes(32), "corpus_docs": 10, "calib_docs": 8,
                   "eval_docs": 2, "split": "test", "calib_tokens": 1000, "eval_tokens": 200,
                   "engine_version": "0.1.0", "engine_commit": "test", "config": {"bits": 8}},
    "metrics": {"ref_ppl": 10.0, "cand_ppl": 10.1, "delta_ppl": 0.01, "kld_mean": 0.001, "kld_p99": 0.01,
                "top1_agreement": 0.99},
    "gate": {"max_delta_ppl": 0.05, "max_kld": None, "min_top1": None, "passed": True},
    "created_utc": "2025-01-01T00:00:00Z", "payload_sha256": hashlib.sha256(cbor2.dumps(payload)).digest(),
    "payload": payload})
head = b"QFORGEA\0" + struct.pack("<IQ", 1, len(body)) + body
open(sys.argv[2], "wb").write(head + hashlib.sha256(head).digest() + struct.pack("<I", 0))
PY
links_cuda=$(ldd "$qf" 2>/dev/null | grep -cE 'libcu(blas|dart)')
for mb in 200 500 1000; do
    if [ "$mb" -lt 1000 ] && [ "$links_cuda" -gt 0 ]; then
        echo "SKIP memlimit_${mb}MB: $qf links the CUDA libraries (libcublasLt alone maps more than ${mb} MB, so the loader fails before main; build with QF_NO_CUDA=1, or once CUDA is loaded with dlopen)"
        skip=$((skip + 1)); continue
    fi
    for c in info verify ppl generate; do
        case $c in
        info) args=(info "$M") ;;
        verify) args=(verify "$d/a.qfa" -m "$M") ;;
        ppl) args=(ppl -m "$M" -f "$T" -c 128 --chunks 2 -t 2) ;;
        generate) args=(generate -m "$M" -p "Once upon a time" -n 8 -t 2) ;;
        esac
        start=$(date +%s)
        (ulimit -v $((mb * 1024)); exec timeout 60 "$qf" "${args[@]}") >"$d/out" 2>"$d/err"
        rc=$?
        secs=$(( $(date +%s) - start ))
        name="memlimit_${mb}MB_$c"
        if [ "$rc" -eq 124 ] || [ "$secs" -gt 20 ]; then bad "$name: hung (${secs}s, exit $rc)"
        elif [ "$rc" -eq 0 ]; then ok "$name (ran, ${secs}s)"
        elif [ "$rc" -eq 5 ] && grep -q "OutOfMemory" "$d/err"; then ok "$name (OutOfMemory, ${secs}s)"
        elif [ "$c" = verify ] && { [ "$rc" -eq 14 ] || [ "$rc" -eq 15 ]; }; then ok "$name (damaged artifact refused, ${secs}s)"
        else bad "$name: exit $rc: $(tail -n 2 "$d/err")"; fi
    done
done
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
