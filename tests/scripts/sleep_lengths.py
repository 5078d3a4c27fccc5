"""`time.sleep` of lengths the builtin refuses or reads its own way, on the main thread and on
another: a tensor, a numpy float32, a str (TypeError: only a float or an integer by `__index__`
is a length), a numpy int64, a negative, NaN, infinity (ValueError, OverflowError), a float.
Each rank prints what each did. The simulated side's told sleep read them with `float()` and
slept where the builtin raises. And whether `time.sleep` pickles as itself, as the builtin does
(`ProcessPoolExecutor.map(time.sleep, ...)`): both sides' patched sleep raised "cannot pickle"."""
import math
import pickle
import threading
import time

import numpy as np
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()


def attempt(where: str) -> None:
    for v in (torch.tensor(0.01), np.float32(0.01), "0.01", np.int64(0), -1.0, math.nan, math.inf, 0.01):
        try:
            time.sleep(v)
            print(f"{where} {type(v).__name__} {v!r}: slept")
        except Exception as e:  # noqa: BLE001 - what it raised is the point
            print(f"{where} {type(v).__name__} {v!r}: {type(e).__name__}: {e}")


print(f"time.sleep pickles as itself: {pickle.loads(pickle.dumps(time.sleep)) is time.sleep}")
attempt("main")
t = threading.Thread(target=attempt, args=("thread",))
t.start()
t.join()
dist.barrier()
dist.destroy_process_group()
