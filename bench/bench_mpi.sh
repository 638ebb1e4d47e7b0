#!/usr/bin/env bash
# bench_mpi.sh: `qforge ppl` throughput against the number of MPI ranks (docs/mpi.md), one
# thread per rank, measured in the same run against one process with one thread:
#   efficiency(N) = throughput(N ranks) / (N * throughput(1 rank))
# and, for reference, one process with N threads. Throughput is rank 0's "tokens/s" (evaluated
# tokens over the wall time of the chunk loop, gathers included; model load and MPI start-up
# excluded). Each configuration runs REPS times; the best is kept (the machine is shared).
# The load average before and after is printed: on a loaded machine the numbers say little.
# usage: bench/bench_mpi.sh [MODEL] [TEXT] [MAX_RANKS]   (env: CTX=256 CHUNKS=12 REPS=3)
set -u
cd "$(dirname "$0")/.."
qf=${QF_BUILD:-build}/qforge
model=${1:-assets/models/qforge-demo-11m-f16.gguf}
text=${2:-assets/corpora/kerneldoc-demo/docs.txt}
max=${3:-$(nproc)}
ctx=${CTX:-256} chunks=${CHUNKS:-12} reps=${REPS:-3}
command -v mpirun >/dev/null || { echo "bench_mpi: mpirun is absent (openmpi-bin)"; exit 1; }
mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none)
tps() { sed -n 's/.* \([0-9.]*\) tokens\/s$/\1/p' | tail -n 1; }
best() { # best of REPS: command...
    local b=0 t
    for _ in $(seq "$reps"); do
        t=$("$@" 2>&1 >/dev/null | tps)
        b=$(awk -v a="$b" -v c="${t:-0}" 'BEGIN { print (c > a ? c : a) }')
    done
    echo "$b"
}
echo "bench_mpi: $model, -c $ctx --chunks $chunks, best of $reps; $(nproc) cores; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
ppl=("$qf" ppl -m "$model" -f "$text" -c "$ctx" --chunks "$chunks")
base=$(best "${mpi[@]}" -np 1 "${ppl[@]}" -t 1)
printf '%-28s %10s %10s %10s\n' "configuration" "tokens/s" "speed-up" "efficiency"
printf '%-28s %10.1f %10.2f %10.2f\n' "mpirun -np 1, -t 1" "$base" 1 1
for n in $(seq 2 "$max"); do
    t=$(best "${mpi[@]}" -np "$n" "${ppl[@]}" -t 1)
    printf '%-28s %10.1f %10.2f %10.2f\n' "mpirun -np $n, -t 1" "$t" "$(awk -v a="$t" -v b="$base" 'BEGIN{print a/b}')" \
        "$(awk -v a="$t" -v b="$base" -v n="$n" 'BEGIN{print a/b/n}')"
    t=$(best "${ppl[@]}" -t "$n")
    printf '%-28s %10.1f %10.2f %10.2f\n' "one process, -t $n" "$t" "$(awk -v a="$t" -v b="$base" 'BEGIN{print a/b}')" \
        "$(awk -v a="$t" -v b="$base" -v n="$n" 'BEGIN{print a/b/n}')"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
