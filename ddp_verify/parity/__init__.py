"""Whole training scripts: ``ddp-verify parity`` runs a script, unmodified, at several
data-parallel layouts and proves each trains what one process on the whole global batch
trains, or says what differs and why.

- :mod:`.recorder`: installed in every rank before the script runs, records what the
  optimizer sees (gradients, parameters after each step), the losses passed to backward and
  fingerprints of the samples that reached the model;
- :mod:`.layouts`: world size x accumulation steps with the global batch fixed, and the
  command each layout runs;
- :mod:`.launch`: each layout started with torchrun (or the user's launcher), bounded in time;
- :mod:`.compare`: recordings held to the reference layout's, with the words for what differs.
"""
