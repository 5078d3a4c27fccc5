"""TORCH_DISTRIBUTED_DEBUG=DETAIL in a simulated run's report (the rank side: `rank.pgwrapper`).

Under DETAIL real Gloo's Flight Recorder records every collective of a wrapped group, and of
its wrapper's helper group, with no group name: torch names the wrapper, not the Gloo
backends inside it, which are what record (measured, torch 2.13: `process_group` ('', '') on
each entry, WORLD's and a subgroup's alike). The real side's trace therefore labels them
`env.group_name("")`, "pg", with no known members. A simulated trace keeps each group apart
while the run goes (the engine pairs operations by group; the checker's findings and the
notes name the groups as they are) and is labelled as Gloo's at the end, so `compare` sets
like beside like. p2p operations are not recorded by FR on either side (`rank.pylog` names
their group) and keep their names.
"""

from __future__ import annotations

from simdist.report import Report
from simdist.script import env
from simdist.script.coordinator import Coordinator
from simdist.vocab import P2P_OPS

UNNAMED = env.group_name("", False)  # "pg"


def relabel_unnamed(report: Report, coord: Coordinator) -> None:
    """Label a simulated run's collectives of unnamed groups as real Gloo's FR does, and say
    why a rank died by SIGSEGV where one told the coordinator so."""
    if report.source == "real":
        return
    for r in report.ranks:
        for e in [*r.trace, r.blocked_in, r.waiting_in]:
            if e is not None and e.group in coord.unnamed and (e.op not in P2P_OPS or e.within):
                e.group, e.group_size = UNNAMED, 0
                if e.op == "scatter":  # its output's size times the group's, which FR's unnamed entry lacks (`fr_trace`)
                    e.numel = 0
    for rank, what in sorted(coord.rank_notes, key=lambda n: -1 if n[0] is None else n[0]):  # not arrival order
        if what == env.SEGV_DDP_DETAIL:
            report.notes.append(
                f"rank {rank}: died by SIGSEGV in DistributedDataParallel's constructor, as on real Gloo: under "
                "TORCH_DISTRIBUTED_DEBUG=DETAIL torch 2.13's DDP logger (set_construction_data_and_log) reads the "
                "group's backend, a ProcessGroupWrapper, as a ProcessGroupGloo")
