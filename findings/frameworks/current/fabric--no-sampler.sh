#!/bin/sh
# fabric/no-sampler: use_distributed_sampler=False.
# What ddp-verify parity says at layout 2x2 (Python 3.11.7, torch 2.13.0+cpu, transformers 5.25.0, accelerate 1.16.0, lightning 2.6.6, trl 1.16.0):
#   every rank trained on the same samples: no DistributedSampler (or a sampler that ignores the rank), so the layout's global batch is one rank's batch repeated 2 times
# Run from the repository root.
ddp-verify parity --layouts 2x2 --global-batch 16 --steps 2 -- python fixtures/scripts/fabric_loop.py --grad-accum '{grad_accum}' --batch-size '{micro_batch}' --variant no-sampler
