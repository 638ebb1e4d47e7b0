#!/usr/bin/env bash
# gpu_device_bundle.sh OUT.tar.xz: pack what test_cuda and bench_gpu need on the GPU machine,
# which has CUDA but not our Debian libraries: build/tests/test_cuda, build/bench/bench_gpu,
# build/bench/gen_model_shapes, build/qforge and the plugin (stripped), every shared library
# they need except glibc, libstdc++/libgcc and CUDA's, OpenBLAS (dlopen'ed, so ldd does not list
# it), and the demo models test_cuda reads besides assets/ (QF_DATA_DIR layout: models/,
# corpora/). On the target, from the repository root:
#   mkdir -p B && tar xJf OUT.tar.xz -C B
#   export LD_LIBRARY_PATH=B/lib QF_CUDA_PLUGIN=B/bin/libqforge-cuda.so QF_DATA_DIR=B/data
#   B/bin/prepare.sh B      # the demo model's q8_0 and q4_0 copies, made there
set -euo pipefail
out=$(realpath -m "$1")
cd "$(dirname "$0")/.."
data=${QF_DATA_DIR:-../shared/data}
st=$(mktemp -d)
trap 'rm -rf "$st"' EXIT
mkdir -p "$st/bin" "$st/lib" "$st/data/models" "$st/data/corpora"
cp build/tests/test_cuda build/bench/bench_gpu build/bench/gen_model_shapes build/qforge build/libqforge-cuda.so "$st/bin/"
strip "$st/bin/"*
for m in qforge-demo-11m-q4_k_m qforge-demo-qwen2-5m-q4_k_m; do
    cp "$data/models/$m.gguf" "$st/data/models/"
done
cp -r "$data/corpora/kerneldoc-demo" "$st/data/corpora/"
# the q8_0 and q4_0 copies of the demo model and the 2048-wide test model are made on the target
# (they would not fit the device tool's 64 MiB carry beside the tree): B/bin/prepare.sh B, after
# the unpacking
cat >"$st/bin/prepare.sh" <<'EOS'
#!/bin/sh
# prepare.sh B: the demo model's q8_0 and q4_0 copies into B/data/models (run from the repository
# root), and a 2048-wide random model in q4_0, q8_0 and q6_K (test_cuda e2e_decode_graph: the
# one-token kernels of the G8 layouts)
set -e
for t in q8_0 q4_0; do
    "$1/bin/qforge" quantize assets/models/qforge-demo-11m-f16.gguf "$1/data/models/qforge-demo-11m-$t.gguf" $t >/dev/null
done
for t in q4_0 q8_0 q6_k; do
    "$1/bin/gen_model_shapes" --shape test-d2048 --type $t -o "$1/data/models/test-d2048-$t.gguf" >/dev/null
done
EOS
chmod +x "$st/bin/prepare.sh"
skip='^(linux-vdso|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libresolv|ld-linux|libstdc\+\+|libgcc_s|libcuda|libcublas|libcudart|libnvidia)'
for f in "$st/bin/"*; do ldd "$f" 2>/dev/null | awk '$3 ~ /^\// {print $1, $3}' || true; done | sort -u |
    while read -r name path; do
        [[ "$name" =~ $skip ]] || cp -L "$path" "$st/lib/$name"
    done
ob=$(readlink -f /usr/lib/x86_64-linux-gnu/libopenblas.so.0)
cp -L "$ob" "$st/lib/libopenblas.so.0"
ldd "$ob" | awk '$3 ~ /^\// {print $1, $3}' | while read -r name path; do
    [[ "$name" =~ $skip ]] || cp -L "$path" "$st/lib/$name"
done
tar cf - -C "$st" . | xz -6 -T2 >"$out"
du -h "$out"
