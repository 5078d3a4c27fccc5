"""`python -m simdist`: the same command line as the `simdist` script."""

from simdist.cli import main

main()
