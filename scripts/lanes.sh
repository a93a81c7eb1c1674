#!/usr/bin/env bash
# lanes.sh CMD_A CMD_B: run two command lines side by side, each pinned to its half of the cores this
# process may use (taskset) with its thread pools sized to that half (torch reads the affinity;
# OpenMP, numba and polars read the variables below), and wait for both. Exits non-zero when either
# failed, and only after both ended (no lane is left running). With one core, or without taskset,
# the two run one after the other. Used by `make demo` for the steps whose times are not figures;
# the timed steps (live runs, cost profiles) run alone before.
set -uo pipefail
mapfile -t cpus < <(python3 -c 'import os; print("\n".join(map(str, sorted(os.sched_getaffinity(0)))))')
n=${#cpus[@]}
if (( n < 2 )) || ! command -v taskset >/dev/null; then
  bash -c "$1" && bash -c "$2"
  exit $?
fi
half=$(( n / 2 ))
lane() {  # lane CPU_LIST THREADS CMD
  OMP_NUM_THREADS=$2 MKL_NUM_THREADS=$2 NUMBA_NUM_THREADS=$2 POLARS_MAX_THREADS=$2 \
    taskset -c "$1" bash -c "$3"
}
a_cpus=$(IFS=,; echo "${cpus[*]:0:half}")
b_cpus=$(IFS=,; echo "${cpus[*]:half}")
set -m  # each lane in its own process group: an interrupt stops both lanes, not only this script
lane "$a_cpus" "$half" "$1" & a=$!
lane "$b_cpus" "$(( n - half ))" "$2" & b=$!
trap 'kill -TERM -- -"$a" -"$b" 2>/dev/null; wait; exit 143' INT TERM
wait "$a"; sa=$?
wait "$b"; sb=$?
if (( sa || sb )); then
  echo "lanes.sh: a lane failed (exit $sa, $sb)" >&2
  exit 1
fi
