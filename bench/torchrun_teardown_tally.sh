#!/bin/bash
# Real torchrun: how long after a worker's `raise` its peers lose it, its process ends, and the
# agent's SIGTERM reaches a sleeping peer (docs/script-backend.md, "torchrun's agent"):
#   bench/torchrun_teardown_tally.sh RUNS [os_exit|abort]   (os_exit: rank 1 fails by os._exit(1), no teardown;
#   abort: by os.abort(), SIGABRT)
# One line per run: the 1-minute load, rank 1's exit code (1: a full teardown; -6: it aborted
# in its teardown), then seconds after the raise: lost, exit, term.
here=$(cd "$(dirname "$0")/.." && pwd)
for i in $(seq 1 "$1"); do
  load=$(cut -d' ' -f1 /proc/loadavg)
  out=$(timeout 120 nice -n 15 "$here/.venv/bin/python" -m torch.distributed.run --standalone --nproc-per-node 2 \
        "$here/bench/torchrun_teardown_probe.py" $2 2>&1)
  code=$(echo "$out" | grep -A1 "rank      : 1 " | grep -o "exitcode *: *-\?[0-9]*" | grep -o -- "-\?[0-9]*$")
  raise=$(echo "$out" | grep -o "RAISE [0-9.]*" | cut -d' ' -f2)
  probe=$(echo "$out" | grep -o "PROBE {.*}" | cut -d' ' -f2-)
  python3 -c "import json,sys; m=json.loads(sys.argv[3]); r=float(sys.argv[2]); print(f'load {sys.argv[1]} rank1_exit ${code:-?} ' + ' '.join(f'{k} {m[k]-r:.3f}' for k in ('lost','exit','term') if k in m))" \
    "$load" "$raise" "${probe:-{\}}" 2>/dev/null || echo "load $load run $i: no probe line"
done
