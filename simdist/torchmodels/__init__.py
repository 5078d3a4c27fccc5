"""Models of torch components (Join, DDP, ZeRO, custom joinables), one module per torch file.

Each model issues, rank by rank, the same collectives in the same order as the torch
source it mirrors (torch 2.13); docstrings name the torch function each method models.
"""
