#!/usr/bin/env bash
# mpi_device_bundle.sh OUT.tar.xz: pack what `mpirun qforge` needs on a machine that has CUDA but
# neither Open MPI nor our Debian libraries (the device machine, docs/mpi.md): build/qforge and
# build/bench/gen_model_shapes (stripped), Open MPI as installed from Debian (the files of
# openmpi-bin, libopenmpi3, openmpi-common, libpmix2, paths kept, to be used with OPAL_PREFIX)
# and every shared library those need except glibc, libstdc++/libgcc and CUDA's. Components for
# fabrics a single host does not use (ucx, ofi, psm, verbs) are left out.
# On the target: tar xJf OUT.tar.xz -C B; then export QF_CUDA_PLUGIN=B/bin/libqforge-cuda.so and
#   export OPAL_PREFIX=B/ompi/usr PATH=B/ompi/usr/bin:$PATH
#   export LD_LIBRARY_PATH=B/lib:B/ompi/usr/lib/x86_64-linux-gnu:B/ompi/usr/lib/x86_64-linux-gnu/openmpi/lib
set -euo pipefail
out=$(realpath -m "$1")
cd "$(dirname "$0")/.."
st=$(mktemp -d)
trap 'rm -rf "$st"' EXIT
mkdir -p "$st/bin" "$st/lib" "$st/ompi"
cp build/qforge build/bench/gen_model_shapes "$st/bin/"
[ -f build/libqforge-cuda.so ] && cp build/libqforge-cuda.so "$st/bin/" # the GPU plugin: QF_CUDA_PLUGIN=B/bin/libqforge-cuda.so
strip "$st/bin/"*
for p in openmpi-bin libopenmpi3 openmpi-common libpmix2; do
    dpkg -L "$p" | while read -r f; do
        case "$f" in /usr/share/doc/* | /usr/share/man/* | /usr/share/lintian/*) continue ;; esac
        if [ -f "$f" ] || [ -L "$f" ]; then cp -a --parents "$f" "$st/ompi/" 2>/dev/null || true; fi
    done
done
# Debian points some paths through /etc/alternatives and /etc/openmpi: keep the real files
find "$st/ompi" -name '*ucx*' -o -name '*ofi*' -o -name '*psm*' -o -name '*openib*' -o -name '*verbs*' -o -name '*uct*' |
    xargs -r rm -f
skip='^(linux-vdso|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libresolv|ld-linux|libstdc\+\+|libgcc_s|libcuda|libcublas|libcudart|libnvidia)'
find "$st/bin" "$st/ompi" -type f \( -perm -u+x -o -name '*.so*' \) | while read -r f; do
    ldd "$f" 2>/dev/null | awk '$3 ~ /^\// {print $1, $3}' || true
done | sort -u | while read -r name path; do
    [[ "$name" =~ $skip ]] && continue
    [ -e "$st/ompi$path" ] && continue
    cp -L "$path" "$st/lib/$name"
done
# OpenBLAS is dlopen'ed at first use (src/kernels/blas.c), so ldd does not list it: carry it and its needs
ob=$(readlink -f /usr/lib/x86_64-linux-gnu/libopenblas.so.0)
cp -L "$ob" "$st/lib/libopenblas.so.0"
ldd "$ob" | awk '$3 ~ /^\// {print $1, $3}' | while read -r name path; do
    [[ "$name" =~ $skip ]] || cp -L "$path" "$st/lib/$name"
done
tar cf - -C "$st" . | xz -1 -T2 >"$out"
du -h "$out"
