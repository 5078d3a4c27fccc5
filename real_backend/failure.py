"""How a rank's failure becomes a result: the category of what it raised, torchelastic's error
file, and a hook that still writes the record when C++ terminates the process (Gloo aborts
with SIGABRT)."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from typing import Any

from simdist.flightrec.format import ERROR_FILE_ENV, WORKER_SOCKET_ENV
from simdist.report import MODEL_FILES, RankError, error_category


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
    return last.endswith(MODEL_FILES)


def record_error_file(exc: BaseException) -> None:
    """Write `exc` to ``TORCHELASTIC_ERROR_FILE`` with torchelastic's own ErrorHandler, as
    ``@record`` does for a torchrun worker (call it inside the ``except`` block: it writes the
    traceback being handled). Nothing when the variable is unset."""
    if not os.environ.get(ERROR_FILE_ENV):
        return
    from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

    try:
        ErrorHandler().record_exception(exc)
    except OSError:
        pass  # the error file's folder is gone: the result file still records the error


def serve_on_demand() -> None:
    """Start torch's control-plane server on ``TORCH_WORKER_SERVER_SOCKET`` (what torchelastic's
    `worker_main` does), so that ``POST /handler/fr_trace_json`` returns this rank's Flight
    Recorder dump while it runs. Nothing when the variable is unset."""
    if not os.environ.get(WORKER_SOCKET_ENV):
        return
    from torch.distributed.elastic.control_plane import worker_main

    _SERVERS.append(worker_main())
    _SERVERS[-1].__enter__()


_SERVERS: list[Any] = []  # kept for the life of the process (it ends with os._exit)


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
