"""The engine: what a training run is and how two runs are compared.

Scenarios (:mod:`.scenario`) and the deterministic builders of their models, data and
optimizers (:mod:`.models`); traces (:mod:`.trace`); the single-process training loop
(:mod:`.training`) and the reference on it (:mod:`.reference`); comparison and its
assert_close-style report (:mod:`.compare`, :mod:`.outcome`) under derived tolerances
(:mod:`.tolerances`); hypothesis strategies (:mod:`.strategies`). Imports only
:mod:`ddp_verify.world`.
"""
