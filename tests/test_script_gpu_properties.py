"""The simulated GPUs' identity (`rank/gpu_props.py`): `torch.cuda.get_device_properties(i)`
has the `uuid` and PCI ids torch 2.13 binds (torch's own `torch/numa/binding.py` reads
`pci_domain_id`, `pci_bus_id`, `pci_device_id`), one of each per GPU, and prints as torch
prints a CUDA device's properties."""

from __future__ import annotations

import pytest

from simdist.script.rank import gpu_props
from tests.conftest import ROOT
from tests.test_script_examples import _verdict, differences
from tests.test_third_party_scripts import _both

SCRIPT = ROOT / "tests" / "scripts" / "gpu_properties.py"


def test_each_gpu_has_its_own_uuid_and_pci_address_on_a_dgx_layout():
    """In-process: `of(i)` is one object per GPU; UUIDs differ and stay the same from run to
    run (derived from the index); the PCI buses are a DGX A100's, domain 0 for 8 GPUs."""
    props = [gpu_props.of(i) for i in range(16)]
    assert gpu_props.of(3) is props[3]
    assert len({str(p.uuid) for p in props}) == 16
    assert str(props[0].uuid) == "774dd7a1-82d5-53dd-9385-08cf08d18db0"
    assert all(len(p.uuid.bytes) == 16 and all(0 <= b < 256 for b in p.uuid.bytes) for p in props)
    assert [p.pci_bus_id for p in props[:8]] == [0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD]
    assert {p.pci_domain_id for p in props[:8]} == {0} and props[8].pci_domain_id == 1
    assert repr(props[1]) == (
        "_CudaDeviceProperties(name='simdist simulated GPU (CPU)', major=8, minor=0, total_memory=81920MB, "
        f"multi_processor_count=108, uuid={props[1].uuid}, pci_bus_id=15, pci_device_id=0, pci_domain_id=0, "
        "L2_cache_size=40MB)")


@pytest.mark.real
def test_device_identity_reads_agree_with_real_gloo(script_zygote, tmp_path):
    """tests/scripts/gpu_properties.py on 3 ranks: simulated and on real Gloo the same lines;
    each rank's GPU has its own UUID and address, reached by index, by `x.device` and by
    default; an index beyond the node raises torch's AssertionError. Before (b74f561) the
    properties printed as a Python dataclass ("DeviceProperties(name=..., total_memory=
    85899345920, ...)") and the script failed at `p.uuid` (AttributeError) on both sides."""
    sim, real = _both(SCRIPT, 3, [], script_zygote, tmp_path)
    assert _verdict(sim) == ["completed"] * 3
    assert differences(sim, real) == []
    out = [line for r in sim.ranks for line in r.output]
    assert "[2] beyond the node: AssertionError Invalid device id" in out
    assert sum(line.endswith("distinct uuids: True") for line in out) == 3
    assert any(line.startswith("[1] uuid: ") and ", pci 0000:0f:00.0, same object by x.device True and by "
               "default True" in line for line in out)
