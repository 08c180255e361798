"""Imported by every rank (``--ddp-preload tests.mutation.rank_patches``): puts the mutants'
dispatchers in place. Inert until a mutant is made active (see :mod:`tests.mutation.mutants`)."""

from tests.mutation.mutants import install

install()
