#!/usr/bin/env bash
# cli_cuda_plugin.sh: the CUDA backend is a plugin (libqforge-cuda.so) loaded only at the first
# GPU use: the CLI links no CUDA library, CPU commands run without the plugin, and --device cuda
# without it (or without a GPU) is a DeviceError (exit 19) that says why; auto falls back to the CPU.
set -u
cd "$(dirname "$0")/.."
B=${QF_BUILD:-build}
Q=$B/qforge
M=assets/models/qforge-demo-11m-f16.gguf
T=assets/corpora/kerneldoc-demo/docs.txt
pass=0 fail=0
ok() { echo "PASS $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
if [ ! -x "$Q" ] || [ ! -f "$M" ]; then
    echo "SKIP cli_cuda_plugin: $Q or $M missing"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
fi
if ldd "$Q" | grep -Eq 'libcuda|libcublas'; then bad "qforge links no CUDA library"; else ok "qforge links no CUDA library"; fi
if [ -f "$B/libqforge.so" ]; then
    if ldd "$B/libqforge.so" | grep -Eq 'libcuda|libcublas'; then bad "libqforge.so links no CUDA library"
    else ok "libqforge.so links no CUDA library"; fi
fi
# a plugin path that does not exist: the CPU runs, cuda is refused with the reason
out=$(QF_CUDA_PLUGIN=/nonexistent/libqforge-cuda.so "$Q" ppl -m "$M" -f "$T" -c 64 --chunks 1 --device cuda 2>&1); rc=$?
[ "$rc" -eq 19 ] && echo "$out" | grep -q "CUDA backend is not available" && ok "--device cuda without the plugin: exit 19, says why" ||
    bad "--device cuda without the plugin: exit 19, says why (rc $rc: $out)"
out=$(QF_CUDA_PLUGIN=/nonexistent/libqforge-cuda.so "$Q" ppl -m "$M" -f "$T" -c 64 --chunks 1 2>&1); rc=$?
[ "$rc" -eq 0 ] && echo "$out" | grep -q "Final estimate" && ok "--device auto without the plugin runs on the CPU" ||
    bad "--device auto without the plugin runs on the CPU (rc $rc)"
# the CPU-only commands start under a tight address-space limit (no CUDA mapped)
skip=0
if [ -n "${QF_ASAN:-}" ]; then
    echo "SKIP ulimit -v checks: ASan reserves terabytes of address space; ulimit -v cannot apply"
    skip=2
else
    out=$( (ulimit -v 204800; "$Q" --version) 2>&1); rc=$?
    [ "$rc" -eq 0 ] && ok "qforge --version under ulimit -v 204800" || bad "qforge --version under ulimit -v 204800 (rc $rc: $out)"
    out=$( (ulimit -v 204800; OPENBLAS_NUM_THREADS=1 "$Q" info "$M") 2>&1); rc=$?
    [ "$rc" -eq 0 ] && ok "qforge info under ulimit -v 204800 (one OpenBLAS thread)" ||
        bad "qforge info under ulimit -v 204800 (rc $rc: $out)"
fi
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
