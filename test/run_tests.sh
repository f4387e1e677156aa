#!/usr/bin/env bash
# Runs every test program given on the command line, echoes their output, and adds up the
# "suite: P passed, F failed, S skipped" lines they print into one closing line. Exit status 1 if any test
# failed or any program exited non-zero (a crash counts as a failure even if it printed no FAIL line).
set -u
total_pass=0; total_fail=0; total_skip=0; crashed=0
for prog in "$@"; do
    echo "=== $prog"
    out=$(mktemp)
    if [[ "$prog" == *.sh ]]; then bash "$prog" > "$out" 2>&1; else "./$prog" > "$out" 2>&1; fi
    rc=$?
    cat "$out"
    line=$(grep -E '^[A-Za-z0-9_./-]+: [0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' "$out" | tail -n 1)
    rm -f "$out"
    if [ -z "$line" ]; then
        echo "FAIL $prog exited with status $rc without a summary line"; total_fail=$((total_fail + 1)); crashed=1; continue
    fi
    p=$(echo "$line" | sed -E 's/.*: ([0-9]+) passed.*/\1/')
    f=$(echo "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/')
    s=$(echo "$line" | sed -E 's/.* ([0-9]+) skipped$/\1/')
    total_pass=$((total_pass + p)); total_fail=$((total_fail + f)); total_skip=$((total_skip + s))
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "FAIL $prog exited with status $rc"; total_fail=$((total_fail + 1)); crashed=1
    fi
done
echo "$total_pass passed, $total_fail failed, $total_skip skipped"
[ "$total_fail" -eq 0 ] && [ "$crashed" -eq 0 ]
