#!/usr/bin/env bash
# cli_harness.sh: the test harness itself (tests/harness.c). A case that runs no check and does
# not SKIP must FAIL; a case whose data file is missing must say SKIP with the file's name.
# The two cases live in test_util and run only under QF_TEST_HARNESS_SELFTEST=1.
set -u
cd "$(dirname "$0")/.."
bin=${QF_BUILD:-build}/tests/test_util
pass=0 fail=0
ok() { echo "PASS $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
if [ ! -x "$bin" ]; then
    echo "SKIP cli_harness: $bin not built"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
fi
out=$(QF_TEST_HARNESS_SELFTEST=1 "$bin" 2>&1); rc=$?
echo "$out" | sed 's/^/    /'
echo "$out" | grep -q '^FAIL selftest_checks_nothing: ran no checks' && ok "a case with no checks fails" ||
    bad "a case with no checks fails"
echo "$out" | grep -q '^SKIP selftest_missing_data: data file no/such/file.gguf not found' &&
    ok "a missing data file is a SKIP naming the file" || bad "a missing data file is a SKIP naming the file"
echo "$out" | grep -q '^0 passed, 1 failed, 1 skipped$' && ok "summary counts" || bad "summary counts"
[ "$rc" -ne 0 ] && ok "exit status nonzero on failure" || bad "exit status nonzero on failure"
echo "$pass passed, $fail failed, 0 skipped"
[ "$fail" -eq 0 ]
