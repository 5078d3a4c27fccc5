"""Gloo's own timeout and monitored_barrier: --case picks how a rank gets stuck (3 ranks).

  never        ranks 0, 1 all-reduce on WORLD (timeout 2 s); rank 2 waits in a subgroup
               all_reduce (torch's default timeout) that rank 1 never joins
  mismatch     rank 1 broadcasts while the others all-reduce
  recv         rank 1 waits for a message rank 0 never sends; ranks 0, 2 in a barrier
  late         rank 1 all-reduces after its peers have finished and exited
  monitored    rank 1 skips a monitored_barrier (1 s) and waits in a barrier instead
  monitored_all ranks 1 and 2 skip a monitored_barrier(wait_all_ranks=True)
  slow         rank 1 sleeps 3 s before it joins its peers' all_reduce
  wait_timeout rank 1 sleeps 3 s; the others wait for their async all_reduce with
               Work.wait(timeout=1 s) (torch: "Operation timed out!", the op goes on), then
               wait again without one (the group's 2 s timeout ends it)
  wait_long    rank 1 sleeps 1 s; the others' Work.wait(timeout=5 s) sees the all_reduce complete
  p2p          Gloo times a p2p's wait, not the op: rank 0 irecv()s from rank 1, sleeps 3 s,
               then waits (rank 1 sends at 4 s: within 2 s of the wait) and sends to rank 2;
               rank 2 irecv()s from rank 0 and blocks 4 s in a subgroup all_reduce before it
               waits (an unwaited irecv does not time out)
  short_group  rank 0 all-reduces alone in a new_group([0, 1], timeout=1 s): its timeout (1 s,
               not the world's 2 s) ends it; it prints that and joins its peers' barrier
  monitored_sub rank 1 runs monitored_barrier(1 s) on the subgroup [1, 2]; rank 2 sleeps 2 s
  retry        the same as slow, and every rank catches the error, retries the all_reduce (what
               happened is printed as one line), then destroys the group and exits normally
Each rank prints how its wait ended (the first line of a monitored_barrier error; Gloo's
own messages differ in their file-and-line prefix and peer address), then re-raises
(--catch: exits 0 instead, so no process fails and torchrun's agent never acts:
tests/test_script_catch_chains.py)."""

import argparse
import datetime
import time

import torch
import torch.distributed as dist


def _said(e: Exception) -> str:
    msg = str(e)
    if "monitoredBarrier" in msg:
        return msg.splitlines()[0]
    return "timed out" if "Timed out" in msg else "peer gone" if "by peer" in msg else msg


def _retry(rank, t):
    """A late rank's peers time out; each rank retries. After a timeout Gloo has closed the
    group's pairs on the ranks that timed out: every retry fails at once, with "Application
    timeout caused pair closure" on a rank whose own timeout closed it or "Connection closed
    by peer" (which one reaches a rank that timed out itself first is a race: both "closed")."""
    said = []
    for _ in range(2):
        try:
            dist.all_reduce(t)
            said.append(f"done {t.tolist()}")
        except RuntimeError as e:
            msg = str(e)
            said.append("closed" if said and ("pair closure" in msg or "by peer" in msg) else _said(e))
    dist.destroy_process_group()
    print(f"rank {rank}: {'; '.join(said)}; destroyed", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", required=True)
    ap.add_argument("--catch", action="store_true")
    args = ap.parse_args()
    case = args.case
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=2))
    rank = dist.get_rank()
    t = torch.ones(4) * rank
    sub = dist.new_group([1, 2])
    one_s = datetime.timedelta(seconds=1)
    try:
        if case == "never":
            dist.all_reduce(t, group=sub) if rank == 2 else dist.all_reduce(t)
        elif case == "mismatch":
            dist.broadcast(t, src=0) if rank == 1 else dist.all_reduce(t)
        elif case == "recv":
            dist.recv(t, src=0) if rank == 1 else dist.barrier()
        elif case == "late":
            dist.barrier()
            if rank == 1:
                dist.all_reduce(t)
        elif case == "monitored":
            dist.barrier() if rank == 1 else dist.monitored_barrier(timeout=one_s)
        elif case == "monitored_all":
            if rank == 0:
                dist.monitored_barrier(timeout=one_s, wait_all_ranks=True)
            else:
                dist.all_reduce(t, group=sub)  # what the skipping ranks wait in instead
        elif case in ("wait_timeout", "wait_long"):
            if rank == 1:
                time.sleep(3 if case == "wait_timeout" else 1)
                dist.all_reduce(t)
            else:
                work = dist.all_reduce(t, async_op=True)
                try:
                    work.wait(timeout=datetime.timedelta(seconds=1 if case == "wait_timeout" else 5))
                except RuntimeError as e:
                    print(f"rank {rank}: {e}", flush=True)
                    work.wait()
        elif case == "p2p":
            if rank == 0:
                work = dist.irecv(t, src=1)
                time.sleep(3)
                work.wait()
                dist.send(t, dst=2)
            elif rank == 1:
                time.sleep(4)
                dist.send(t, dst=0)
                dist.all_reduce(t, group=sub)
            else:
                got = torch.zeros(4)
                work = dist.irecv(got, src=0)
                dist.all_reduce(t, group=sub)
                work.wait()
                t = got
        elif case == "short_group":
            short = dist.new_group([0, 1], timeout=one_s)
            if rank == 0:
                try:
                    dist.all_reduce(t, group=short)
                except RuntimeError as e:
                    print(f"rank {rank}: {_said(e)}", flush=True)
            dist.barrier()
        elif case == "monitored_sub":
            if rank == 1:
                dist.monitored_barrier(group=sub, timeout=one_s)
            elif rank == 2:
                time.sleep(2)
        elif case in ("slow", "retry"):
            if rank == 1:
                time.sleep(3)
            if case == "retry":
                return _retry(rank, t)
            dist.all_reduce(t)
    except RuntimeError as e:
        print(f"rank {rank}: {_said(e)}", flush=True)
        if args.catch:
            return
        raise
    print(f"rank {rank}: done {t.tolist()}", flush=True)


if __name__ == "__main__":
    main()
