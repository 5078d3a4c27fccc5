"""Not a hang: both main threads wait in a recv; a thread of rank 1 waits for a message on a
side group that nobody sends, with `Work.wait(timeout=SECONDS)`. Gloo ends that wait with an
error after SECONDS; the thread then sends what rank 0 waits for, and the run completes."""
import datetime
import sys
import threading

import torch
import torch.distributed as dist

seconds = float(sys.argv[1])
dist.init_process_group("gloo")
rank = dist.get_rank()
side = dist.new_group([0, 1])
t = torch.zeros(2)
if rank == 1:
    def waits_then_sends():
        work = dist.irecv(torch.zeros(1), src=0, group=side)
        try:
            work.wait(timeout=datetime.timedelta(seconds=seconds))
        except RuntimeError as e:
            print(1, "side wait ended:", "timed out" if "imeout" in str(e) or "imed out" in str(e) else e, flush=True)
        dist.send(torch.ones(2), dst=0)

    helper = threading.Thread(target=waits_then_sends)
    helper.start()
    dist.recv(t, src=0)
    helper.join()
else:
    dist.recv(t, src=1)
    dist.send(t + 1, dst=1)
print(rank, "done", t.tolist(), flush=True)
