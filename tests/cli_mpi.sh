#!/usr/bin/env bash
# cli_mpi.sh: the Open MPI scale-out end to end (docs/mpi.md) on the embedded demo model and
# corpus with small settings, at -np 2 and 3 (oversubscribed on the 2-core machine):
#   - `qforge ppl`: the same stdout, every digit, for any rank count, with and without KL
#     divergence (a base file written by 3 ranks is byte-identical to one process's);
#   - `qforge calibrate --artifact kv-dict` with a reservoir smaller than the tokens (so the
#     sampling replaces slots): the same certificate and payload for any rank count, the
#     rank count recorded as mpi_ranks; `qforge sweep`: the same table;
#   - faults: a rank that fails (--mpi-fail-rank 1) or dies (--mpi-fail-rank 1:exit) fails the
#     job with an error naming the rank and leaves no .qfa; ranks given different models or
#     corpora are refused before any work.
# Skips when mpirun is absent or the qforge binary was built without Open MPI.
set -u
cd "$(dirname "$0")/.."
qf=${QF_BUILD:-build}/qforge
model=assets/models/qforge-demo-11m-f16.gguf
text=assets/corpora/kerneldoc-demo/docs.txt
pass=0 fail=0 skip=0
ok() { echo "PASS $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
if ! command -v mpirun >/dev/null 2>&1; then
    echo "SKIP cli_mpi: mpirun is absent (Debian: openmpi-bin, libopenmpi-dev; scripts/deps.sh)"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
fi
if [ ! -x "$qf" ] || [ ! -f "$model" ] || ! ldd "$qf" 2>/dev/null | grep -q libmpi; then
    echo "SKIP cli_mpi: needs $qf built with Open MPI (pkg-config ompi-c) and $model"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
fi
# Open MPI's own allocations are not ours to judge under LeakSanitizer
[ -n "${QF_ASAN:-}" ] && export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0
export OMPI_MCA_rmaps_base_oversubscribe=1
mpi=(mpirun --allow-run-as-root --oversubscribe -x ASAN_OPTIONS -x UBSAN_OPTIONS -x QF_NO_PROGRESS)
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT

# ppl: one process, then 1, 2, 3 ranks
ppl=("$qf" ppl -m "$model" -f "$text" -c 64 --chunks 5 -t 1)
"${ppl[@]}" >"$d/ppl.0" 2>/dev/null
# (under ASan only the 2-rank runs: the suite's time)
full=1; [ -n "${QF_ASAN:-}" ] && full=
for n in 2 ${full:+3}; do
    "${mpi[@]}" -np $n "${ppl[@]}" >"$d/ppl.$n" 2>"$d/err"
    if [ $? -eq 0 ] && grep -q "Final estimate" "$d/ppl.$n" && cmp -s "$d/ppl.0" "$d/ppl.$n"; then
        ok "ppl -np $n: the same output as one process ($(grep Final "$d/ppl.$n"))"
    else bad "ppl -np $n differs"; diff "$d/ppl.0" "$d/ppl.$n" | head -5; tail -3 "$d/err"; fi
done
# the ranks meet once per window of rounds (all of them by default): windows of 1 and 2 rounds
# (5 chunks on 2 ranks: 3 rounds, the last one half empty) print the same bytes
for w in 1 2; do
    QF_PPL_WINDOW_ROUNDS=$w "${mpi[@]}" -x QF_PPL_WINDOW_ROUNDS -np 2 "${ppl[@]}" >"$d/pplw.$w" 2>"$d/err"
    if [ $? -eq 0 ] && cmp -s "$d/ppl.0" "$d/pplw.$w"; then ok "ppl -np 2, windows of $w round(s): the same output"
    else bad "ppl -np 2, windows of $w round(s) differ"; diff "$d/ppl.0" "$d/pplw.$w" | head -5; tail -3 "$d/err"; fi
done
"${ppl[@]}" --kl-divergence-base "$d/base.0" -ctk f32 -ctv f32 >/dev/null 2>&1
"${mpi[@]}" -np 3 "${ppl[@]}" --kl-divergence-base "$d/base.3" -ctk f32 -ctv f32 >/dev/null 2>&1
if [ -s "$d/base.0" ] && cmp -s "$d/base.0" "$d/base.3"; then ok "KL base file written by 3 ranks = one process's"
else bad "KL base file written by 3 ranks differs"; fi
"${ppl[@]}" --kl-divergence-base "$d/base.0" --kl-divergence -ctk q4_0 -ctv q4_0 >"$d/kld.0" 2>/dev/null
"${mpi[@]}" -np 2 "${ppl[@]}" --kl-divergence-base "$d/base.0" --kl-divergence -ctk q4_0 -ctv q4_0 >"$d/kld.2" 2>/dev/null
if grep -q "Mean    KLD" "$d/kld.2" && cmp -s "$d/kld.0" "$d/kld.2"; then ok "KLD -np 2: every statistic identical"
else bad "KLD -np 2 differs"; diff "$d/kld.0" "$d/kld.2" | head -5; fi

# calibrate: the learned artifact and its certificate, whatever the rank count
cal=("$qf" calibrate -m "$model" --artifact kv-dict --atoms 16 --sparsity 2 --iters 2 --gate 100 --max-kld 100
     --max-kld-p99 100 --allow-worse-than-baseline -c 64 --max-tok 512
     --eval-chunks 2 --capture 200 -t 1)
cert() { "$qf" verify "$1" --json 2>/dev/null | grep -v '"file\|"created_utc\|"mpi_ranks'; }
"${cal[@]}" -o "$d/a0.qfa" >/dev/null 2>&1
cert "$d/a0.qfa" >"$d/a0.json"
for n in $([ -n "$full" ] && echo 3 || echo 2); do
    "${mpi[@]}" -np $n "${cal[@]}" -o "$d/a$n.qfa" >/dev/null 2>"$d/err"
    cert "$d/a$n.qfa" >"$d/a$n.json"
    if [ -s "$d/a0.json" ] && cmp -s "$d/a0.json" "$d/a$n.json" &&
        "$qf" verify "$d/a$n.qfa" --json 2>/dev/null | grep -q "\"mpi_ranks\": $n"; then
        ok "calibrate -np $n: the same payload and certificate, mpi_ranks $n"
    else bad "calibrate -np $n differs"; diff "$d/a0.json" "$d/a$n.json" | head -6; tail -3 "$d/err"; fi
done
sw=("$qf" sweep -m "$model" --configs 16x2,24x3,8x1 --iters 1 -c 64 --max-tok 512 --eval-chunks 2 --capture 200 -t 1)
"${sw[@]}" >"$d/sw.0" 2>/dev/null
"${mpi[@]}" -np 2 "${sw[@]}" >"$d/sw.2" 2>/dev/null
if grep -q "^16x2" "$d/sw.0" && cmp -s "$d/sw.0" "$d/sw.2"; then ok "sweep -np 2: the same table"
else bad "sweep -np 2 differs"; diff "$d/sw.0" "$d/sw.2" | head -5; fi

# faults: a failing rank, a dying rank, mismatched inputs
"${mpi[@]}" -np 2 "${cal[@]}" -o "$d/f.qfa" --mpi-fail-rank 1 >/dev/null 2>"$d/err"
rc=$?
if [ $rc -ne 0 ] && grep -q "error: CaptureFailed: .*rank 1 of 2: .*injected failure" "$d/err" && [ ! -e "$d/f.qfa" ]; then
    ok "a failing rank: exit $rc, the error names rank 1, no .qfa"
else bad "a failing rank: exit $rc"; tail -5 "$d/err"; fi
"${mpi[@]}" -np 2 "${ppl[@]}" --mpi-fail-rank 1 >/dev/null 2>"$d/err"
rc=$?
if [ $rc -eq 4 ] && grep -q "rank 1 of 2" "$d/err"; then ok "ppl: a failing rank 1: IoError exit 4 naming it"
else bad "ppl: a failing rank 1: exit $rc"; tail -5 "$d/err"; fi
"${mpi[@]}" -np 2 "${cal[@]}" -o "$d/g.qfa" --mpi-fail-rank 1:exit >/dev/null 2>"$d/err"
rc=$?
if [ $rc -ne 0 ] && grep -q "rank 1: injected death" "$d/err" && [ -z "$(ls "$d" | grep '^g\.qfa')" ]; then
    ok "a dying rank: exit $rc, no .qfa and no temporary file"
else bad "a dying rank: exit $rc"; ls "$d"; tail -5 "$d/err"; fi
[ -z "$full" ] && { echo "$pass passed, $fail failed, 0 skipped"; [ "$fail" -eq 0 ]; exit; }
cp "$model" "$d/other.gguf" && printf 'x' >>"$d/other.gguf"
"${mpi[@]}" -np 1 "${ppl[@]}" : -np 1 "$qf" ppl -m "$d/other.gguf" -f "$text" -c 64 --chunks 5 -t 1 >"$d/out" 2>"$d/err"
rc=$?
if [ $rc -eq 1 ] && grep -q "model SHA-256 differs from rank 0's" "$d/err" && ! grep -q Final "$d/out"; then
    ok "ppl: different models refused before any work (exit $rc)"
else bad "ppl: different models: exit $rc"; tail -5 "$d/err"; fi
head -c 20000 "$text" >"$d/c1.txt"
head -c 20000 "$text" >"$d/c2.txt" && echo "one more line" >>"$d/c2.txt"
"${mpi[@]}" -np 1 "${cal[@]}" --corpus "$d/c1.txt" -o "$d/m.qfa" : -np 1 "${cal[@]}" --corpus "$d/c2.txt" -o "$d/m.qfa" \
    >/dev/null 2>"$d/err"
rc=$?
if [ $rc -eq 1 ] && grep -q "corpus SHA-256 differs" "$d/err" && [ ! -e "$d/m.qfa" ]; then
    ok "calibrate: different corpora refused before any work (exit $rc), no .qfa"
else bad "calibrate: different corpora: exit $rc"; tail -5 "$d/err"; fi

echo "$pass passed, $fail failed, 0 skipped"
[ "$fail" -eq 0 ]
