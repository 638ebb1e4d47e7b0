#!/usr/bin/env bash
# bench_mpi_scaling.sh QFORGE MODEL TEXT [RANKS...]: the scaling table of docs/mpi.md in one run.
# For each N (default 1 2 4 8 16): `mpirun -np N qforge ppl -t 1` (chunks sharded over ranks),
# one process with `-t N` (the same chunks, N threads), and N independent single-thread
# processes without MPI each running CHUNKS/N chunks at the same time (the machine's ceiling for
# N busy cores: no communication at all). Throughput = tokens/s of the chunk loop as qforge
# prints it (rank 0's wall time from the first chunk to the last record added; model load,
# tokenizing and MPI start-up excluded); for the independent processes the sum of their rates.
# Efficiency = throughput / (N x the -np 1 throughput). Every MPI run's stdout must equal the
# -np 1 run's byte for byte (PPL bit-identical); a difference is printed as DIFFERS.
# env: CTX (256) CHUNKS (32, a multiple of every N) REPS (1) MPIRUN (mpirun) MPIFLAGS
# (--allow-run-as-root --oversubscribe --bind-to none) DEADLINE (seconds; later reps skipped).
set -u
qf=$1 model=$2 text=$3
shift 3
ranks=("$@")
[ ${#ranks[@]} -eq 0 ] && ranks=(1 2 4 8 16)
ctx=${CTX:-256} chunks=${CHUNKS:-32} reps=${REPS:-1} deadline=${DEADLINE:-100000}
mpirun=${MPIRUN:-mpirun}
read -r -a mflags <<<"${MPIFLAGS:---allow-run-as-root --oversubscribe --bind-to none}"
t_start=$(date +%s)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tps() { sed -n 's/.* \([0-9.]*\) tokens\/s$/\1/p' "$1" | tail -n 1; }
ppl=(ppl -m "$model" -f "$text" -c "$ctx" --chunks "$chunks" --device cpu)
echo "bench_mpi_scaling: $(basename "$model") -c $ctx --chunks $chunks, best of $reps; nproc $(nproc); load $(cut -d' ' -f1-3 /proc/loadavg)"
declare -A best
for rep in $(seq "$reps"); do
    [ "$rep" -gt 1 ] && [ $(( $(date +%s) - t_start )) -gt "$deadline" ] && { echo "(rep $rep skipped: past ${deadline}s)"; break; }
    for n in "${ranks[@]}"; do
        "$mpirun" "${mflags[@]}" -np "$n" "$qf" "${ppl[@]}" -t 1 >"$tmp/mpi$n.out" 2>"$tmp/mpi$n.err"
        [ "$n" = "${ranks[0]}" ] && cp "$tmp/mpi$n.out" "$tmp/ref.out"
        cmp -s "$tmp/mpi$n.out" "$tmp/ref.out" || echo "DIFFERS: -np $n stdout differs from -np ${ranks[0]}"
        v=$(tps "$tmp/mpi$n.err"); k=mpi$n
        awk -v a="${v:-0}" -v b="${best[$k]:-0}" 'BEGIN{exit !(a > b)}' && best[$k]=$v
        "$qf" "${ppl[@]}" -t "$n" >"$tmp/thr$n.out" 2>"$tmp/thr$n.err"
        cmp -s "$tmp/thr$n.out" "$tmp/ref.out" || echo "DIFFERS: -t $n stdout differs from -np ${ranks[0]}"
        v=$(tps "$tmp/thr$n.err"); k=thr$n
        awk -v a="${v:-0}" -v b="${best[$k]:-0}" 'BEGIN{exit !(a > b)}' && best[$k]=$v
        for i in $(seq "$n"); do
            "$qf" ppl -m "$model" -f "$text" -c "$ctx" --chunks $((chunks / n)) --device cpu -t 1 >/dev/null 2>"$tmp/ind$n.$i.err" &
        done
        wait
        v=$(for i in $(seq "$n"); do tps "$tmp/ind$n.$i.err"; done | awk '{s += $1} END {print s + 0}'); k=ind$n
        awk -v a="${v:-0}" -v b="${best[$k]:-0}" 'BEGIN{exit !(a > b)}' && best[$k]=$v
        echo "rep $rep n $n: mpi ${best[mpi$n]} thr ${best[thr$n]} ind ${best[ind$n]} ($(( $(date +%s) - t_start ))s)"
    done
done
b1=${best[mpi${ranks[0]}]}
printf '| N | mpirun -np N -t 1 tok/s | eff. | one process -t N tok/s | eff. | N independent processes tok/s | eff. |\n|---|---|---|---|---|---|---|\n'
for n in "${ranks[@]}"; do
    awk -v n="$n" -v b="$b1" -v m="${best[mpi$n]}" -v t="${best[thr$n]}" -v i="${best[ind$n]}" \
        'BEGIN { printf "| %d | %.1f | %.2f | %.1f | %.2f | %.1f | %.2f |\n", n, m, m / b / n, t, t / b / n, i, i / b / n }'
done
grep -h "Final estimate" "$tmp/ref.out"
echo "load after $(cut -d' ' -f1-3 /proc/loadavg); $(( $(date +%s) - t_start ))s"
