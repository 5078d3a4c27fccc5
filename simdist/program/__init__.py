"""What a scenario means, rank by rank: the actions (`actions`) and the interpreter that
turns a scenario into each rank's sequence of them (`interpret`). Pure Python; the
simulator (`simdist.simrank`) and the real backend (`real_backend.torchrank`) execute them."""
