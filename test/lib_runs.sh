# lib_runs.sh: what the shell tests of whole training runs share (sourced, not run: test_mpi.sh, test_tp.sh,
# test_gpu_nccl.sh, test_gpu_tp.sh): the PASS/FAIL/SKIP counters, a run's losses from its main.log, the largest
# relative difference between two runs' losses, and mpirun with the flag a root user needs.
passed=0; failed=0; skipped=0
ok() { echo "PASS $1: $2"; passed=$((passed + 1)); }
bad() { echo "FAIL $1: $2"; failed=$((failed + 1)); }
skip() { echo "SKIP $1"; skipped=$((skipped + 1)); }
# the training and validation losses a run logged, one a line
losses() { grep -o 'trl:[0-9.]*\|tel:[0-9.]*' "$1/main.log" | cut -d: -f2; }
# the largest relative difference between two runs' losses ("missing" when fewer than 20 were logged)
track() { paste <(losses "$1") <(losses "$2") | awk 'BEGIN{w=0; n=0} {d=($1-$2)/$2; if (d<0) d=-d; if (d>w) w=d; n++}
                                                    END{if (n < 20) print "missing"; else printf("%.2e", w)}'; }
# x < t (and x not "missing")
under() { awk -v x="$1" -v t="$2" 'BEGIN{exit !(x != "missing" && x + 0 < t)}'; }
# MPI=(mpirun ...) with the arguments given; root needs --allow-run-as-root
mpi_launcher() {
    MPI=(mpirun --oversubscribe "$@")
    [ "$(id -u)" = 0 ] && MPI=(mpirun --allow-run-as-root --oversubscribe "$@")
    return 0
}
