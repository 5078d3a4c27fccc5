"""What a script reads of its GPU's identity: `torch.cuda.get_device_properties(i)` printed
whole, its `uuid` (str and bytes) and PCI ids (domain, bus, device: the sysfs address torch's
own NUMA binding builds from them), for its own device by index, by `x.device` and by default,
and an index beyond the node (torch: AssertionError "Invalid device id"). Started
torchrun-style, one GPU per rank."""

import os

import torch
import torch.distributed as dist

local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dist.init_process_group("nccl")
rank = dist.get_rank()
p = torch.cuda.get_device_properties(local)
x = torch.ones(2, device="cuda")
print(f"[{rank}] props: {p}")
print(f"[{rank}] uuid: {p.uuid} bytes {len(p.uuid.bytes)}, pci {p.pci_domain_id:04x}:{p.pci_bus_id:02x}:"
      f"{p.pci_device_id:02x}.0, same object by x.device {torch.cuda.get_device_properties(x.device) is p} "
      f"and by default {torch.cuda.get_device_properties() is p}")
try:
    torch.cuda.get_device_properties(torch.cuda.device_count())
    print(f"[{rank}] beyond the node: accepted")
except AssertionError as e:
    print(f"[{rank}] beyond the node: AssertionError {e}")
uuids = [None] * dist.get_world_size()
dist.all_gather_object(uuids, str(p.uuid))
print(f"[{rank}] distinct uuids: {len(set(uuids)) == len(uuids)}")
dist.destroy_process_group()
