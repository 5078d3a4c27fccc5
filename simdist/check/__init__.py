"""The checker: classifies what went wrong in a run and explains it in words.

* `classify` -- failure kinds as trusted tools name them (Flight Recorder analyzer,
  TORCH_DISTRIBUTED_DEBUG=DETAIL): op/size/dtype/reduce-op/root mismatch, ranks missing
  from a collective (hang), p2p without a partner, a peer that exited; plus the loop's
  semantic invariants (per-group collective counts, DDP final-model broadcast, inputs).
* `waitfor` -- the wait-for graph of a hung run (networkx), cut down to the deadlock core.
* `explain` -- the CLI hooks `annotate_report` / `explain_report`: sentences naming the
  collective, its origin, size, group and input, and what the other ranks were doing.

See docs/checker.md.
"""

from simdist.check.classify import Verdict, check_run

__all__ = ["Verdict", "check_run"]
