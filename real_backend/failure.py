"""How a rank's failure becomes a result: the category of what it raised, and a hook that
still writes the record when C++ terminates the process (Gloo aborts with SIGABRT)."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from typing import Any

from simdist.report import RankError, error_category


def categorise(exc: BaseException) -> RankError:
    """RankError (type, message, category) for an exception a rank raised."""
    msg = str(exc)
    cat = error_category(msg, runtime_error=isinstance(exc, RuntimeError), timeout_error=isinstance(exc, TimeoutError),
                         in_model=_raised_in_model(exc))
    return RankError(type=type(exc).__name__, message=msg, category=cat)


def _raised_in_model(exc: BaseException) -> bool:
    tb = exc.__traceback__
    last = None
    while tb is not None:
        last = tb.tb_frame.f_code.co_filename
        tb = tb.tb_next
    if last is None:
        return False
    last = last.replace(os.sep, "/")
    return last.endswith(
        ("nn/parallel/distributed.py", "optim/zero_redundancy_optimizer.py", "torch/distributed/utils.py")
    )


# ------------------------------------------------------------------ crash capture
_TERMINATE_KEEP: list[Any] = []


def install_terminate_hook(callback: Callable[[], None]) -> bool:
    """Run `callback` when C++ calls std::terminate (e.g. gloo::EnforceNotMet escaping a
    Gloo I/O thread), then chain to the previous handler, which prints
    ``terminate called after throwing ... what(): ...`` and aborts (SIGABRT) as before.

    Returns False when libstdc++'s std::set_terminate cannot be found.
    """
    try:
        lib = ctypes.CDLL("libstdc++.so.6")
        set_terminate = lib._ZSt13set_terminatePFvvE
    except (OSError, AttributeError):
        return False
    handler_t = ctypes.CFUNCTYPE(None)
    set_terminate.restype = ctypes.c_void_p
    set_terminate.argtypes = [ctypes.c_void_p]
    previous: list[int | None] = [None]

    def on_terminate() -> None:
        try:
            callback()
        except BaseException:  # noqa: BLE001 - nothing may escape into C++
            pass
        if previous[0]:
            handler_t(previous[0])()
        os.abort()

    cb = handler_t(on_terminate)
    _TERMINATE_KEEP.append(cb)
    previous[0] = set_terminate(ctypes.cast(cb, ctypes.c_void_p))
    return True
