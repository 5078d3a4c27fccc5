"""simdist: a discrete-event simulator and correctness checker for PyTorch distributed training."""

__version__ = "0.1.0"
