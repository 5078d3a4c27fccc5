"""Entry point of simdist's rank-side layer in every process of a script run.

This directory is prepended to PYTHONPATH by the launcher. Outside a script run (no
SIMDIST_SCRIPT_SOCKET) it does nothing; inside, it installs the layer. Either way it then
runs the sitecustomize that this one shadows, if any.
"""

import os
import sys


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if os.path.abspath(entry or ".") == here:
            continue
        path = os.path.join(entry or ".", "sitecustomize.py")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as fh:
                exec(compile(fh.read(), path, "exec"), {"__name__": "sitecustomize", "__file__": path})
            return


if os.environ.get("SIMDIST_SCRIPT_SOCKET"):
    # the rank layer of the simdist this folder belongs to (the launcher's: they speak one
    # protocol), not whichever one the environment installs (a venv's editable install of
    # another checkout); its folder leaves sys.path again, the script's imports are its own
    _root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
    sys.path.insert(0, _root)
    try:
        from simdist.script.rank import boot
    finally:
        sys.path.remove(_root)

    boot.install()
_chain()
