#!/usr/bin/env bash
# test.sh: install what is missing, build with warnings as errors, run the whole suite, then
# run it again under AddressSanitizer + UBSan. Prints one closing "N passed, N failed" line.
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh || exit 1
jobs=$(nproc)
# per-run logs: two runs at once (two clones) must not read each other's logs
logs=$(mktemp -d "${TMPDIR:-/tmp}/qforge-test.XXXXXX") || exit 1
trap 'rm -rf "$logs"' EXIT
make -j"$jobs" all >"$logs/build.log" 2>&1 || { tail -n 60 "$logs/build.log"; echo "0 passed, 1 failed"; exit 1; }
echo "== release build =="
QF_BUILD=build tests/run.sh > >(tee "$logs/release.log") 2>&1
rc1=$?
echo "== AddressSanitizer + UBSan build =="
make -j"$jobs" BUILD=build-asan OPT="-O1 -g -fno-omit-frame-pointer" QF_NO_CUDA=1 \
    SANFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined" all >"$logs/build-asan.log" 2>&1 \
    || { tail -n 60 "$logs/build-asan.log"; echo "0 passed, 1 failed"; exit 1; }
QF_ASAN=1 ASAN_OPTIONS=detect_leaks=1 QF_BUILD=build-asan tests/run.sh > >(tee "$logs/asan.log") 2>&1
rc2=$?
sleep 0.2
p=0 f=0 s=0
for l in "$logs/release.log" "$logs/asan.log"; do
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$l" | tail -n 1)
    # a pass that printed no closing line (killed, crashed harness) counts as one failure
    [ -n "$line" ] || line="0 passed, 1 failed, 0 skipped"
    p=$((p + $(echo "$line" | sed -E 's/^([0-9]+) passed.*/\1/')))
    f=$((f + $(echo "$line" | sed -E 's/^[0-9]+ passed, ([0-9]+) failed.*/\1/')))
    s=$((s + $(echo "$line" | sed -nE 's/.*, ([0-9]+) skipped.*/\1/p;t;s/.*/0/p')))
done
echo "== total (release + sanitizers) =="
echo "$p passed, $f failed, $s skipped"
[ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && [ "$f" -eq 0 ]
