"""dist.all_gather_coalesced (deprecated, still in torch 2.13): each rank gathers two
tensors of different sizes in one collective. The output lists are indexed rank first
(`output_lists[r][k]`: rank r's input k), as torch's docstring builds them; the simulator
read them input first, so it failed with an IndexError on 3 ranks and put the blocks in the
wrong tensors on 2. Found by bench/script_sweep.py's `coalesced_lists` family (seed 6
cases 0 and 8, seed 7 case 4). Started torchrun-style, any world size >= 2."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ins = [torch.arange(2.0) + 10 * rank, torch.arange(3.0) + 100 * rank]
    outs = [[torch.zeros(2), torch.zeros(3)] for _ in range(world)]
    dist.all_gather_coalesced(outs, ins)
    print(f"[{rank}] {[[t.tolist() for t in per_rank] for per_rank in outs]}", flush=True)
    work = dist.all_gather_coalesced(outs, [ins[0] * 2, ins[1] * 2], async_op=True)
    work.wait()
    print(f"[{rank}] async {[[t.tolist() for t in per_rank] for per_rank in outs]}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
