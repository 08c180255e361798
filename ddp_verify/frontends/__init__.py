"""The front ends: the pytest plugin (:mod:`.pytest_plugin`), the ``ddp-verify`` command
(:mod:`.cli`), ``ddp_verify.check()`` (:mod:`.api`), the options all three share
(:mod:`.options`) and the world they hand out (:mod:`.verifying`). No logic of their own."""
