"""Not a hang: rank 1's main thread waits in a recv from rank 0, and rank 0's main thread in
a recv from rank 1 that a thread of rank 1 sends after SECONDS (HOW: `sleep`, a thread that
sleeps first, as an async checkpoint's or a heartbeat's does; `timer`, a `threading.Timer`).
For that time both main threads are asleep in torch's waits with no CPU used; the run
completes. With HOW `quits` the thread sleeps and ends without sending: a hang from then on,
both main threads in their recv. Each rank prints whether its recv lasted the thread's SECONDS
by its clock (the simulator ends the thread's timed wait in simulated time, `rank.timedwait`).
The clocks start after a barrier, and "lasted" allows 50 ms: on real Gloo rank 0 may leave the
barrier a little after rank 1's thread began its sleep (a fresh-clone CI run saw rank 0 read
under SECONDS after init alone); what the line tells apart is a recv that lasted the sleep from
one that did not wait for it."""
import sys
import threading
import time

import torch
import torch.distributed as dist

how, seconds = sys.argv[1], float(sys.argv[2])
dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.zeros(2)
dist.barrier()
t0 = time.monotonic()
if rank == 1:
    def send():
        dist.send(torch.ones(2), dst=0)

    def later():
        time.sleep(seconds)
        if how != "quits":
            send()

    helper = threading.Timer(seconds, send) if how == "timer" else threading.Thread(target=later)
    helper.start()
    dist.recv(t, src=0)
    helper.join()
else:
    dist.recv(t, src=1)
    dist.send(t + 1, dst=1)
print(rank, "done", t.tolist(), "after the thread's sleep:", time.monotonic() - t0 >= seconds - 0.05, flush=True)
dist.destroy_process_group()
