"""`python -m simdist`: the same command line as the `simdist` script."""

from simdist.cli import main

if __name__ == "__main__":  # not when a worker process re-imports the main module (Dask, spawn)
    main()
