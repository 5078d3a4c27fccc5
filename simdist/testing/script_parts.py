"""The pieces of a generated script that `simdist.testing.scripts` (the sweep's generator)
and `simdist.testing.script_api` (its API-surface families) share: the dtypes drawn, the
state of one script's draws, and a tensor's source text."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

DTYPES = ("float32", "float64", "int64", "int32", "float16", "bfloat16")
FLOAT_DTYPES = ("float32", "float64", "float16", "bfloat16")


@dataclass
class ScriptCtx:
    """What the body generator needs as it draws: the world, the drawn features, a counter
    for fresh variable names, and async works still to wait for."""

    rng: random.Random
    extra: random.Random  # the draws of the operations added later (`EXTRA_OPS`): the others' stay as they were
    api: random.Random  # the draws of the API surface added last (`API_OPS`, `GROUP_KINDS`, `WAIT_KINDS`)
    world: int
    features: set[str]
    members: list[int] | None = None
    n: int = 0
    pending: list[str] = field(default_factory=list)

    def var(self, stem: str) -> str:
        self.n += 1
        return f"{stem}{self.n}"


def tensor_expr(ctx: ScriptCtx, dtype: str, n: int, value: str) -> str:
    """Source of a 1-d tensor of `n` elements from `value` (an expression of rank and step)."""
    return f"torch.arange({n}, dtype=torch.{dtype}) + ({value})" if n > 1 else \
        f"torch.full((1,), {value}, dtype=torch.{dtype})"
