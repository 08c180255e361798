"""User code as it is written: plug-in kinds and their adapters (:mod:`.kinds`,
:mod:`.adapters`), the search for a counterexample (:mod:`.search`), the diagnosis of a
divergence with simulated mistakes (:mod:`.diagnose`, :mod:`.mistakes`) and the standalone
reproducer (:mod:`.reproducer`). Imports methods, engine and world."""
