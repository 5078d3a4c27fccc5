"""c10d's CollectiveFingerPrint as the simulated ProcessGroupWrapper words it
(`simdist.script.rank.fingerprint`), against messages real Gloo gave (torch 2.13, torchrun,
TORCH_DISTRIBUTED_DEBUG=DETAIL, 2 ranks): the quirks of c10's printing included."""

from __future__ import annotations

import torch

from simdist.script.rank.fingerprint import FingerPrint, mismatch_message

CPU = ("TensorOptions(dtype=float (default), device=cpu, layout=Strided (default), requires_grad=false (default), "
       "pinned_memory=false (default), memory_format=(nullopt))")


def _fp(op: str, tensors: list[torch.Tensor], seq: int) -> FingerPrint:
    return FingerPrint.of(op, tensors, seq)


def test_a_fingerprint_survives_its_serialisation():
    fp = _fp("_REDUCE_SCATTER_BASE", [torch.ones(4, 1, dtype=torch.float64), torch.ones(2, 1)], 5)
    assert fp.serialize() == [16, 5, 2, 7, 6, 0, 0, 2, 4, 1, 2, 2, 1]
    assert FingerPrint.deserialize(fp.serialize()) == fp


def test_two_dimensional_shapes_differ_as_gloo_words_them():
    mine, theirs = _fp("ALLREDUCE", [torch.ones(2, 3)], 1), _fp("ALLREDUCE", [torch.ones(3, 2)], 1)
    assert mismatch_message(0, mine, 1, theirs) == (
        "Detected mismatch between collectives on ranks. Rank 0 is running collective: CollectiveFingerPrint("
        f"SequenceNumber=1, OpType=ALLREDUCE, TensorShape=[2, 3], TensorDtypes=Float, TensorDeviceTypes={CPU}), but "
        "Rank 1 is running collective: CollectiveFingerPrint(SequenceNumber=1, OpType=ALLREDUCE, TensorShape=[3, 2], "
        f"TensorDtypes=Float, TensorDeviceTypes={CPU}).Collectives differ in the following aspects:   Tensor Tensor "
        "shapes: 2 3vs 3 2")


def test_two_tensors_print_space_separated():
    mine = _fp("_REDUCE_SCATTER_BASE", [torch.ones(4, 1, dtype=torch.float64), torch.ones(2, 1)], 1)
    theirs = _fp("_REDUCE_SCATTER_BASE", [torch.ones(4, 1), torch.ones(2, 1)], 1)
    assert mismatch_message(1, mine, 0, theirs).endswith(
        f"TensorShape=[4, 1], TensorDtypes=Double Float, TensorDeviceTypes={CPU} {CPU}), but Rank 0 is running "
        f"collective: CollectiveFingerPrint(SequenceNumber=1, OpType=_REDUCE_SCATTER_BASE, TensorShape=[4, 1], "
        f"TensorDtypes=Float Float, TensorDeviceTypes={CPU} {CPU}).Collectives differ in the following aspects:   "
        "Tensor Tensor dtypes: Double Floatvs Float Float")


def test_a_peer_of_another_length_is_read_from_its_length():
    """A barrier (3 values) against an all_reduce (7): each reads the other's length as an op
    type (rank 1's barrier saw "GATHER", rank 0's all_reduce saw "REDUCE"), sequence number 0."""
    barrier, reduce = _fp("BARRIER", [], 3), _fp("ALLREDUCE", [torch.ones(2)], 3)
    seen_by_barrier = FingerPrint.deserialize([len(reduce.serialize())])
    assert mismatch_message(1, barrier, 0, seen_by_barrier) == (
        "Detected mismatch between collectives on ranks. Rank 1 is running collective: CollectiveFingerPrint("
        "SequenceNumber=3OpType=BARRIER), but Rank 0 is running collective: CollectiveFingerPrint(SequenceNumber=0"
        "OpType=GATHER).Collectives differ in the following aspects: \t Sequence number: 3vs 0  Op type: BARRIERvs "
        "GATHER")
    seen_by_reduce = FingerPrint.deserialize([len(barrier.serialize())])
    assert mismatch_message(0, reduce, 1, seen_by_reduce) == (
        "Detected mismatch between collectives on ranks. Rank 0 is running collective: CollectiveFingerPrint("
        f"SequenceNumber=3, OpType=ALLREDUCE, TensorShape=[2], TensorDtypes=Float, TensorDeviceTypes={CPU}), but "
        "Rank 1 is running collective: CollectiveFingerPrint(SequenceNumber=0OpType=REDUCE).Collectives differ in "
        "the following aspects: \t Sequence number: 3vs 0  Op type: ALLREDUCEvs REDUCE  Tensor Tensor shapes: 2vs   "
        f"Tensor Tensor dtypes: Floatvs   Tensor Tensor devices: {CPU}vs ")


def test_a_scalar_has_an_empty_shape():
    scalar = _fp("ALLREDUCE", [torch.tensor(1.0)], 1)
    assert scalar.text() == (f"CollectiveFingerPrint(SequenceNumber=1, OpType=ALLREDUCE, TensorShape=[], "
                             f"TensorDtypes=Float, TensorDeviceTypes={CPU})")
    assert mismatch_message(0, scalar, 1, FingerPrint.deserialize([7])).endswith(
        f"Op type: ALLREDUCEvs GATHER  Tensor Tensor dtypes: Floatvs   Tensor Tensor devices: {CPU}vs ")
