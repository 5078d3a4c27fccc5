"""A rank whose Gloo wait ran out had already sent what its peers had received (3 ranks).
Ranks 0 and 2 all-gather while rank 1 sends rank 2 a message it never receives. In the ring,
rank 2 sends its block to rank 0 and waits for rank 1's; rank 0 gets it, waits to send to
rank 1 and times out first (0.3 s), closes its pairs and exits. Rank 2 had nothing pending
with rank 0 (Gloo moved the block once both ends posted): it goes on waiting for rank 1,
whose send times out (1 s) and closes its pairs, and fails only then with the peer gone.
Found by bench/script_sweep.py (seed 9, case 11): the simulator treated the timed-out rank's
messages as never sent, so rank 2 failed as rank 0 exited, and rank 1 as rank 2 exited.

With --catch every rank catches its error, prints it and exits 0: no process fails, so
torchrun's agent never acts and the whole chain shows (tests/test_script_catch_chains.py)."""

import datetime
import sys

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    # every rank is up before the short timeouts start: each rank's own, in a group of its own
    g = dist.new_group(timeout=datetime.timedelta(seconds=(0.3, 1.0, 30.0)[rank]))
    try:
        if rank == 1:
            dist.send(torch.ones(3), dst=2, group=g)
        else:
            out = torch.zeros(6)
            dist.all_gather_into_tensor(out, torch.full((2,), float(rank)), group=g)
    except RuntimeError as e:
        print(f"[{rank}] {'timed out' if 'Timed out' in str(e) else 'peer gone'}", flush=True)
        if "--catch" not in sys.argv[1:]:
            raise


if __name__ == "__main__":
    main()
