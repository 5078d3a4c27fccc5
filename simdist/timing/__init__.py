"""Timing: making, checking and explaining the cost model's numbers.

``fit``          fitting closed forms and piecewise curves to measured times
``experiments``  the held-out experiment of ``simdist compare-timing`` and its statistics
``plots``        its measured-vs-simulated plot
``explain``      one collective's cost taken apart (``simdist explain``)
``sweeps``       sweep sizes and the algbw/busbw conventions shared with the real backend

The model these feed lives in `simdist.network` (`cost.CostModel`, `profile.Profile`)
and `simdist.collectives` (algorithms, Gloo's programs).
"""
