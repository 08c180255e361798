#!/bin/sh
# plain-ddp/padded-lm/own-mean: each micro-batch's own token mean.
# What ddp-verify parity says at layout 1x4 (Python 3.11.7, torch 2.13.0+cpu, transformers 5.25.0, accelerate 1.16.0, lightning 2.6.6, trl 1.16.0):
#   each micro-batch's loss averaged over its own tokens and the micro-batches weighted equally, where the reference layout takes one mean over the step's tokens (micro-batch 1: 9 of the step's 29 tokens; micro-batch 2: 4 of the step's 29 tokens; micro-batch 3: 5 of the step's 29 tokens; micro-batch 4: 11 of the step's 29 tokens; each counted alike)
# Run from the repository root.
ddp-verify parity --layouts 1x4 --global-batch 8 --steps 2 -- python fixtures/scripts/padded_lm.py --grad-accum '{grad_accum}' --batch-size '{micro_batch}' --variant per-micro-batch
