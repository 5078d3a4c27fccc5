"""Speaking the c10d Flight Recorder: read users' dumps, diagnose them, replay them, write them.

* `format` -- the dump's fields, versions, op and dtype names, and the environment torch
  reads (TORCH_FR_BUFFER_SIZE, TORCH_FR_DUMP_TEMP_FILE, ...); re-exported here.
* `unpickle` -- a pickle reader that admits only the plain values a dump holds.
* `ingest` -- per-rank dump files (pickle or JSON, a folder or files, torch's file names)
  and torchelastic error files -> `Dumps`.
* `rebuild` -- `Dumps` -> the `Report` simdist's checker reads (traces, statuses, groups,
  the mismatches the engine would have reported) and the Python frames of blocked calls.
* `replay` -- the per-rank operations -> a scenario of raw collectives that reproduces them.
* `diagnose` -- all of it together, judged by `simdist.check` as a simulated run is.
* `export` -- a simdist run (simulated or real) -> per-rank dumps torch's `torchfrtrace` reads.

See docs/flight-recorder.md.
"""

from simdist.flightrec.format import (
    DEFAULT_DUMP_PREFIX,
    ERROR_FILE_ENV,
    FR_BUFFER_SIZE,
    FR_DUMP_ENV,
    FR_ENV,
    NO_DTYPE,
    WORKER_SOCKET_ENV,
    dump_path,
    fr_dtype,
    fr_numel,
    fr_op_name,
)
from simdist.vocab import FR_DTYPES

__all__ = [
    "DEFAULT_DUMP_PREFIX", "ERROR_FILE_ENV", "FR_BUFFER_SIZE", "FR_DTYPES", "FR_DUMP_ENV", "FR_ENV", "NO_DTYPE",
    "WORKER_SOCKET_ENV", "dump_path", "fr_dtype", "fr_numel", "fr_op_name",
]
