#!/bin/sh
# trl-sft/padding-free/row-mean: a sequence mean per row where the collator flattens each micro-batch into one.
# What ddp-verify parity says at layout 1x4 (Python 3.11.7, torch 2.13.0+cpu, transformers 5.25.0, accelerate 1.16.0, lightning 2.6.6, trl 1.16.0):
#   each micro-batch's loss averaged over its own tokens and the micro-batches weighted equally, where the reference layout takes one mean over the step's tokens (micro-batch 1: 4 of the step's 47 tokens; micro-batch 2: 15 of the step's 47 tokens; micro-batch 3: 16 of the step's 47 tokens; micro-batch 4: 12 of the step's 47 tokens; each counted alike)
# Run from the repository root.
ddp-verify parity --layouts 1x4 --global-batch 8 --steps 2 -- python fixtures/scripts/trl_sft.py --grad-accum '{grad_accum}' --batch-size '{micro_batch}' --padding-free --variant row-mean
