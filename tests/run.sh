#!/usr/bin/env bash
# run.sh: run every test binary in $QF_BUILD/tests (default build/), then the CLI end-to-end
# scripts tests/cli_*.sh, and print the suite's closing line "N passed, N failed, N skipped".
# Run from the repository root. QF_TEST_FILTER=substr limits the run to matching names;
# QF_TEST_JOBS=N runs N at once (default: the number of cores).
set -u
build=${QF_BUILD:-build}
export QF_BUILD=$build
export QF_DATA_DIR=${QF_DATA_DIR:-$(cd "$(dirname "$0")/.." && pwd)/../shared/data}
export QF_NO_PROGRESS=1
# A fresh clone has no ../shared/data: run on the fixtures the project can make itself (the
# embedded demo model and corpus, its q8_0 quantization; tests/helpers/make_fixtures.sh)
# instead of skipping everything that needs a model.
if [ ! -d "$QF_DATA_DIR" ] && [ -x "$build/qforge" ]; then
    if tests/helpers/make_fixtures.sh "$build/fixtures" "$build/qforge"; then
        export QF_DATA_DIR=$(cd "$build/fixtures" && pwd)
        echo "note: no shared data directory; using generated fixtures in $QF_DATA_DIR"
    fi
fi
pass=0 fail=0 skip=0
failed_names=()
log_dir=$(mktemp -d)
# QF_TEST_JOBS (default: the number of cores) tests run at once, each into its own log; the
# results are then read in the fixed order below, so the output does not depend on the timing
jobs=${QF_TEST_JOBS:-$(nproc 2>/dev/null || echo 1)}
names=()
for t in "$build"/tests/test_* tests/cli_*.sh; do
    [ -e "$t" ] || continue
    name=$(basename "$t")
    [ -n "${QF_TEST_FILTER:-}" ] && [[ "$name" != *"$QF_TEST_FILTER"* ]] && continue
    names+=("$name")
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n 2>/dev/null || true; done
    (
        start=$(date +%s)
        # each test gets its own TMPDIR: two at once must not share scratch names
        mkdir -p "$log_dir/$name.tmp"
        if [[ "$t" == *.sh ]]; then TMPDIR="$log_dir/$name.tmp" bash "$t" >"$log_dir/$name.log" 2>&1; rc=$?
        else TMPDIR="$log_dir/$name.tmp" "$t" >"$log_dir/$name.log" 2>&1; rc=$?; fi
        echo "$rc $(( $(date +%s) - start ))" >"$log_dir/$name.rc"
        rm -rf "$log_dir/$name.tmp"
    ) &
done
wait
for name in "${names[@]}"; do
    read -r rc secs <"$log_dir/$name.rc" || { rc=1; secs=0; }
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log_dir/$name.log" | tail -n 1)
    if [ -z "$line" ]; then
        echo "FAIL $name: no summary line (exit $rc)"; tail -n 20 "$log_dir/$name.log"
        fail=$((fail + 1)); failed_names+=("$name"); continue
    fi
    p=$(echo "$line" | sed -E 's/^([0-9]+) passed.*/\1/')
    f=$(echo "$line" | sed -E 's/^[0-9]+ passed, ([0-9]+) failed.*/\1/')
    s=$(echo "$line" | sed -nE 's/.*, ([0-9]+) skipped.*/\1/p'); s=${s:-0}
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
    pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + s))
    printf '%-28s %3d passed, %d failed, %d skipped (%ds)\n' "$name" "$p" "$f" "$s" "$secs"
    grep -E '^SKIP ' "$log_dir/$name.log" | sed 's/^/    /'
    if [ "$f" -ne 0 ]; then failed_names+=("$name"); grep -vE '^(PASS|SKIP) ' "$log_dir/$name.log" | tail -n 40 | sed 's/^/    /'; fi
done
rm -rf "$log_dir"
[ ${#failed_names[@]} -eq 0 ] || echo "failing: ${failed_names[*]}"
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
