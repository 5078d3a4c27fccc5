"""Origin labels from Python frames: which torch component (or user line) issued a collective.

Shared by the real backend (frames from the Flight Recorder, `real_backend.record`) and the
script backend (frames the rank-side process group captures at each call, `simdist.script`),
so both sides name the same call the same way.

Every frame's (file, line) is resolved to the qualified name of the enclosing function by
parsing that file once (`ast`), so `_DDPJoinHook.main_hook` and `_ZeROJoinHook.main_hook`,
or `Counter.find_common_rank` and `AllReducer.find_common_rank`, are told apart. The
innermost recognised frame decides. Labels are value-free (see `simdist.vocab.ORIGINS`).
"""

from __future__ import annotations

import ast
import functools
import os
import re
import sysconfig
from dataclasses import dataclass
from typing import Any

from simdist.vocab import USER_ORIGIN_PREFIX

# --------------------------------------------------------------------------- frame -> qualname
_MODULES = {
    "algorithms/join.py": "join",
    "nn/parallel/distributed.py": "ddp",
    "optim/zero_redundancy_optimizer.py": "zero",
    "torch/distributed/utils.py": "dutils",
    "torch/autograd/graph.py": "autograd",
    "torch/autograd/__init__.py": "autograd",
    "real_backend/joinables.py": "joinables",
    "real_backend/torchrank.py": "torchrank",
}


def _module_tag(filename: str) -> str | None:
    f = filename.replace(os.sep, "/")
    for suffix, tag in _MODULES.items():
        if f.endswith(suffix):
            return tag
    return None


@functools.cache
def _function_spans(filename: str) -> list[tuple[int, int, str]]:
    """(first line, last line, qualname) of every function in a source file."""
    try:
        with open(filename, encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
    except (OSError, SyntaxError, ValueError):
        return []
    spans: list[tuple[int, int, str]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                q = f"{prefix}{child.name}"
                start = min([d.lineno for d in child.decorator_list] + [child.lineno])
                spans.append((start, child.end_lineno or child.lineno, q))
                visit(child, q + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return spans


def qualname_at(filename: str, line: int) -> str | None:
    """Qualified name of the innermost function of `filename` containing `line`."""
    best: tuple[int, str] | None = None
    for start, end, q in _function_spans(filename):
        if start <= line <= end and (best is None or end - start < best[0]):
            best = (end - start, q)
    return best[1] if best else None


@functools.cache
def _async_lines_in(filename: str, qualname: str) -> frozenset[int]:
    """Lines inside `qualname` holding a call with `async_op=True` (the heartbeat)."""
    try:
        with open(filename, encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
    except (OSError, SyntaxError, ValueError):
        return frozenset()
    span = next(((s, e) for s, e, q in _function_spans(filename) if q == qualname), None)
    if span is None:
        return frozenset()
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and span[0] <= node.lineno <= span[1]:
            for kw in node.keywords:
                if kw.arg == "async_op" and isinstance(kw.value, ast.Constant) and kw.value.value is True:
                    lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return frozenset(lines)


@dataclass(frozen=True)
class Frame:
    tag: str | None  # module tag (see _MODULES) or None for frames we do not interpret
    qual: str | None
    name: str
    filename: str
    line: int


_INSTALLED = re.compile(r"/(?:site|dist)-packages/")
_STDLIB = re.compile(r"/lib/python\d+\.\d+/")


@functools.cache
def local_source(filename: str) -> str:
    """The file to read for a frame's source on this machine: the file itself, or, for a
    frame recorded on another machine (a Flight Recorder dump), the same installed package's
    file here (``.../site-packages/torch/nn/parallel/distributed.py`` -> this interpreter's
    site-packages). Lines agree when the torch version does."""
    if os.path.exists(filename):
        return filename
    m = _INSTALLED.search(filename)
    if m is not None:
        for key in ("purelib", "platlib"):
            here = os.path.join(sysconfig.get_paths()[key], filename[m.end():])
            if os.path.exists(here):
                return here
    return filename


def is_library_file(filename: str) -> bool:
    """Installed packages and the standard library (judged by the path alone, so that it
    works for frames recorded on another machine): everything that is not the user's code."""
    return filename.startswith("<") or bool(_INSTALLED.search(filename) or _STDLIB.search(filename))


def resolve_frames(raw: list[dict[str, Any]]) -> list[Frame]:
    out = []
    for f in raw:
        filename, line = local_source(str(f.get("filename", ""))), int(f.get("line", 0))
        tag = _module_tag(filename)
        out.append(Frame(tag, qualname_at(filename, line) if tag else None, str(f.get("name", "")), filename, line))
    return out


def phase_of(frames: list[Frame]) -> str:
    """The scenario's phase names where frames tell them: DDP construction, Join's exit."""
    if any(f.tag == "ddp" and f.qual == "DistributedDataParallel.__init__" for f in frames):
        return "init"
    if any(f.tag == "join" and f.qual == "Join.__exit__" for f in frames):
        return "join_exit"
    return "loop"


def classify(frames: list[Frame], dtype: str) -> str | None:
    """Origin label of a collective from its frames (innermost first).

    Returns "user" for the scenario driver's own collective steps (TorchRank.user_collective) (labelled later from the step
    window), None when nothing is recognised.
    """
    quals = {(f.tag, f.qual) for f in frames if f.tag}

    def under(tag: str, qual: str) -> bool:
        return (tag, qual) in quals

    in_ddp_main_hook = under("ddp", "_DDPJoinHook.main_hook")
    for f in frames:
        t, q = f.tag, f.qual
        if t is None or q is None:
            continue
        if t == "join":
            if q == "Join.notify_join_context":
                heartbeat = f.line in _async_lines_in(f.filename, q)
                return "join.notify_join_context.heartbeat" if heartbeat else "join.notify_join_context.throw_check"
            if q == "Join._get_num_nonjoined_procs":
                return "join.exit.count_nonjoined"
            if q == "Join._notify_procs_to_terminate":
                return "join.exit.notify_terminate"
        elif t == "dutils":
            if q == "_verify_param_shape_across_processes":
                return "ddp.init.verify_params"
            if q in ("_sync_module_states", "_sync_params_and_buffers"):
                if under("ddp", "DistributedDataParallel._sync_final_model"):
                    return "ddp.post_hook.broadcast_final_model"
                return "ddp.init.sync_module_states"
        elif t == "ddp":
            m = q.rsplit(".", 1)[-1]
            if m == "_find_common_rank":
                if under("ddp", "DistributedDataParallel._sync_final_model"):
                    return "ddp.post_hook.find_common_rank"
                return "ddp.join_hook.find_common_rank" if in_ddp_main_hook else "ddp.pre_forward.find_common_rank"
            if m in ("_distributed_broadcast_coalesced", "_default_broadcast_coalesced", "_sync_module_buffers"):
                return "ddp.join_hook.sync_buffers" if in_ddp_main_hook else "ddp.pre_forward.sync_buffers"
            if m == "_check_global_requires_backward_grad_sync":
                return "ddp.join_hook.requires_grad_sync" if in_ddp_main_hook else "ddp.pre_forward.requires_grad_sync"
            if m == "_match_all_reduce_for_bwd_pass":
                return "ddp.join_hook.bucket_allreduce"
            if m == "_match_unused_params_allreduce":
                return "ddp.join_hook.unused_map_allreduce"
            if q == "_DDPJoinHook.main_hook":
                return "ddp.join_hook.rebuild_buckets"
            if m == "_pre_forward":
                return "ddp.pre_forward.rebuild_buckets"
        elif t == "zero":
            m = q.rsplit(".", 1)[-1]
            if m in ("_broadcast_params_from_rank", "_sync_params"):
                if under("zero", "_ZeROJoinHook.main_hook"):
                    return "zero.join_hook.broadcast_shard"
                return "zero.step.broadcast_shard"
        elif t == "joinables":
            label = _JOINABLE_LABELS.get(q)
            if label:
                return label
        elif t == "torchrank":
            if q == "TorchRank.user_collective":
                return "user"
        elif t == "autograd":
            # Collectives issued by DDP's C++ reducer from autograd hooks during backward (or by
            # its comm hook); one that other Python issued under autograd (FSDP2's post-backward
            # reduce-scatter, DTensor's redistribution in a backward) is not DDP's.
            if not all(_under_ddp_reducer(inner.filename) for inner in frames[:frames.index(f)]):
                return None
            return "ddp.backward.unused_map_allreduce" if dtype == "int32" else "ddp.backward.bucket_allreduce"
    return None


# What may stand between DDP's C++ reducer (called by autograd) and a collective: its comm
# hooks, the futures their callbacks chain on, DDP's own Python hooks (`_delayed_all_reduce_hook`
# of `delay_all_reduce_named_params`), c10d's Python entry points, and simdist's own layer in
# the rank (the real side's op log wraps c10d's calls).
_DDP_REDUCER_PATHS = ("torch/distributed/algorithms/ddp_comm_hooks/", "torch/futures/", "torch/nn/parallel/distributed.py",
                      "torch/distributed/distributed_c10d.py", "torch/distributed/c10d_logger.py")
SIMDIST_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _under_ddp_reducer(filename: str) -> bool:
    f = filename.replace(os.sep, "/")
    return filename.startswith(SIMDIST_DIR) or any(p in f for p in _DDP_REDUCER_PATHS)


_JOINABLE_LABELS = {
    "Counter.__call__": "counter.call.allreduce",
    "CounterJoinHook.main_hook": "counter.main_hook.allreduce",
    "Counter.find_common_rank": "counter.post_hook.find_common_rank",
    "CounterJoinHook.post_hook": "counter.post_hook.broadcast_max_count",
    "AllReducer.__call__": "allreducer.call.allreduce",
    "AllReducerJoinHook.main_hook": "allreducer.main_hook.allreduce",
    "AllReducer.find_common_rank": "allreducer.post_hook.find_common_rank",
    "AllReducerJoinHook.post_hook": "allreducer.post_hook.broadcast",
}


# --------------------------------------------------------------------------- user code
UNKNOWN_ORIGIN = "unknown"


def user_label(filename: str, line: int) -> str:
    """Origin label of a call in the user's own code: `user.<file name>:<line>`."""
    return f"{USER_ORIGIN_PREFIX}{os.path.basename(filename)}:{line}"


def script_origin(frames: list[Frame], user: list[bool], dtype: str) -> str:
    """Origin label of a call made by a user's script (frames innermost first).

    Only the frames inside the innermost user frame are classified: a collective that the
    user's own code issues from within a torch context (a hook called by autograd, a
    joinable's hook called by Join) is the user's, while one that torch issues on the
    user's behalf (DDP's reducer under `loss.backward()`) keeps its component label.
    """
    k = next((i for i, u in enumerate(user) if u), len(frames))
    label = classify(frames[:k], dtype)
    if label is not None and label != "user":
        return label
    if k < len(frames):
        return user_label(frames[k].filename, frames[k].line)
    return UNKNOWN_ORIGIN
