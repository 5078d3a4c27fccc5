#!/bin/bash
# Real torchrun's agent, tallied (docs/script-backend.md, "torchrun's agent"):
#   bench/torchrun_agent_tally.sh SCRIPT RUNS [SCRIPT ARGS...]
# Per run of `torchrun --standalone --nproc-per-node 2 SCRIPT ARGS`: rank 0's exit code (from
# ChildFailedError's table; 0 when not listed), whether it printed a RuntimeError traceback
# itself, whether it printed "0 done".
here=$(cd "$(dirname "$0")/.." && pwd)
f=$1; n=$2; shift 2
for i in $(seq 1 "$n"); do
  out=$(timeout 120 nice -n 15 "$here/.venv/bin/python" -m torch.distributed.run --standalone --nproc-per-node 2 "$f" "$@" 2>&1)
  code=$(echo "$out" | grep -A3 "rank      : 0 " | grep exitcode | awk '{print $3}')
  raised=$(echo "$out" | grep -c "^\[rank0\]: RuntimeError")
  done_=$(echo "$out" | grep -c "^0 done")
  echo "run $i rank0_exitcode=${code:-0} rank0_raised=$raised done=$done_"
done
