#!/bin/sh
# lightning-trainer/injected-sampler: Lightning's own DistributedSampler (documented).
# What ddp-verify parity says at layout 2x2 (Python 3.11.7, torch 2.13.0+cpu, transformers 5.25.0, accelerate 1.16.0, lightning 2.6.6, trl 1.16.0):
#   the samples of a step depend on the layout (step 0: 8 of its 8 samples are not the reference's at that step; Lightning (the Trainer, and Fabric's setup_dataloaders), as documented, puts a DistributedSampler that shuffles into a training loader under a distributed strategy and keeps the loader's own order on one device: give the loader a DistributedSampler of your own (the same shuffle and seed at every world size) with use_distributed_sampler=False, or give the reference the same strategy (Trainer(strategy='ddp'), fabric run --strategy ddp)): a shuffle or a split whose order changes with the world size or the micro-batch size
# Run from the repository root.
ddp-verify parity --layouts 2x2 --global-batch 8 --steps 2 -- python fixtures/scripts/lightning_trainer.py --grad-accum '{grad_accum}' --batch-size '{micro_batch}' --variant injected
