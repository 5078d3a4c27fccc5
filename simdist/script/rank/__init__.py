"""The rank-side layer: what simdist installs inside the processes of a user's script.

`bootstrap/sitecustomize.py` runs at interpreter start in every process of a script run
(children the script spawns included) and calls `boot.install`. The rest is installed
when torch is imported: the simulated process group (`pg`) and its backend (`backend`), the patched
`init_process_group` (`patches`), and CUDA-to-CPU device remapping (`devices`).
"""
