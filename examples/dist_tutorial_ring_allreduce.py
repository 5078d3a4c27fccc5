#!/usr/bin/env python
# From the PyTorch tutorial "Writing Distributed Applications with PyTorch" (dist_tuto):
# the tutorial's run.py template with section 4.5's allreduce() built from isend/recv.
# The tutorial gives allreduce() only; run() below calls it and prints the sum.
import os
import sys
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

def allreduce(send, recv):
   rank = dist.get_rank()
   size = dist.get_world_size()
   send_buff = send.clone()
   recv_buff = send.clone()
   accum = send.clone()

   left = ((rank - 1) + size) % size
   right = (rank + 1) % size

   for i in range(size - 1):
       if i % 2 == 0:
           # Send send_buff
           send_req = dist.isend(send_buff, right)
           dist.recv(recv_buff, left)
           accum[:] += recv_buff[:]
       else:
           # Send recv_buff
           send_req = dist.isend(recv_buff, right)
           dist.recv(send_buff, left)
           accum[:] += send_buff[:]
       send_req.wait()
   recv[:] = accum[:]


def run(rank, size):
    """ Sum every rank's tensor with the ring all-reduce above. """
    send = torch.ones(4) * (rank + 1)
    recv = torch.zeros(4)
    allreduce(send, recv)
    print('Rank ', rank, ' has data ', recv)

def init_process(rank, size, fn, backend='gloo'):
    """ Initialize the distributed environment. """
    os.environ['MASTER_ADDR'] = '127.0.0.1'
    os.environ['MASTER_PORT'] = '29500'
    dist.init_process_group(backend, rank=rank, world_size=size)
    fn(rank, size)


if __name__ == "__main__":
    world_size = 2
    processes = []
    if "google.colab" in sys.modules:
        print("Running in Google Colab")
        mp.get_context("spawn")
    else:
        mp.set_start_method("spawn")
    for rank in range(world_size):
        p = mp.Process(target=init_process, args=(rank, world_size, run))
        p.start()
        processes.append(p)

    for p in processes:
        p.join()
