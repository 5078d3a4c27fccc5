"""CUDA events timing a step, as GPU scripts time theirs (rasbt/LLMs-from-scratch's
`02_opt_multi_gpu_ddp.py` prints tokens a second from `t_start.elapsed_time(t_end)`): the time
between two records is the step's, not 0 (a script dividing by it raised ZeroDivisionError in
simdist alone); an event made without timing, or not recorded, raises torch's ValueError."""

import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record()
x = torch.ones(4, device="cuda")
time.sleep(0.05)
dist.all_reduce(x)
end.record()
torch.cuda.synchronize()
ms = start.elapsed_time(end)
print(f"[{rank}] step of at least 50 ms: {ms >= 50.0}, tokens a second {x.numel() / (ms / 1000) > 0}")
for a, b in ((torch.cuda.Event(), end), (torch.cuda.Event(enable_timing=True), end)):
    try:
        a.elapsed_time(b)
    except ValueError as e:
        print(f"[{rank}] {e}")
event = torch.cuda.current_stream().record_event()
print(f"[{rank}] recorded on the stream: {event.query()}, {type(event).__name__}")
dist.destroy_process_group()
