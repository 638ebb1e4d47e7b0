#!/usr/bin/env bash
# mpi_scaling_device.sh BUNDLE.tar.xz: the device run behind docs/mpi.md's scaling table, on a
# machine without Open MPI or our Debian libraries. BUNDLE is bench/mpi_device_bundle.sh's
# output (qforge built with Open MPI, Open MPI relocated with OPAL_PREFIX, the non-system
# libraries ldd lists, OpenBLAS); bench/bench_mpi_scaling.sh must sit next to this script.
# Run from the repository root (the demo model and corpus are read from assets/). Writes
# lscpu.txt and scaling.txt into $OUT (default /tmp). About 90 s on 16 cores.
set -u
T0=$(date +%s)
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp}
B=/tmp/bx; mkdir -p $B && tar xJf "$1" -C $B
export OPAL_PREFIX=$B/ompi/usr PATH=$B/ompi/usr/bin:$PATH
export LD_LIBRARY_PATH=$B/lib:$B/ompi/usr/lib/x86_64-linux-gnu:$B/ompi/usr/lib/x86_64-linux-gnu/openmpi/lib
export OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1 OMPI_MCA_plm=isolated OMPI_MCA_btl_vader_single_copy_mechanism=none
{ lscpu; echo "nproc $(nproc)"; cat /proc/loadavg; } >"$out/lscpu.txt" 2>&1
head -c 60000 assets/corpora/kerneldoc-demo/docs.txt >/tmp/t.txt
M=/tmp/m.gguf; cp assets/models/qforge-demo-11m-f16.gguf $M
X="-x LD_LIBRARY_PATH -x OPAL_PREFIX -x PATH"
MPIRUN=orterun MPIFLAGS="--allow-run-as-root --oversubscribe --bind-to none $X" REPS=2 DEADLINE=50 CTX=256 CHUNKS=32 \
    timeout 120 "$here/bench_mpi_scaling.sh" $B/bin/qforge $M /tmp/t.txt 1 2 4 8 16 2>&1 | tee "$out/scaling.txt"
# pinned, for comparison: one rank per core / hardware thread
for v in "8 --map-by core --bind-to core" "16 --map-by hwthread --bind-to hwthread"; do
    set -- $v; n=$1; shift
    orterun --allow-run-as-root --oversubscribe $X "$@" -np $n $B/bin/qforge ppl -m $M -f /tmp/t.txt -c 256 --chunks 32 \
        --device cpu -t 1 2>&1 >/dev/null | grep -E "tokens/s|rror" | tail -n 2 | sed "s/^/pinned np $n ($*): /" | tee -a "$out/scaling.txt"
done
echo "total $(( $(date +%s) - T0 ))s" | tee -a "$out/scaling.txt"
