#!/bin/sh
# grpo-loop/kl-per-micro-batch: the KL term averaged over each micro-batch's own tokens, on every one.
# What ddp-verify parity says at layout 1x4 (Python 3.11.7, torch 2.13.0+cpu, transformers 5.25.0, accelerate 1.16.0, lightning 2.6.6, trl 1.16.0):
#   the gradient the optimizer saw differs from the reference's and is not a multiple of it (cosine 0.7231 with it, norm ratio 1.185): some samples, micro-batches or ranks counted other than their share
# Run from the repository root.
ddp-verify parity --layouts 1x4 --global-batch 8 --steps 2 -- python fixtures/scripts/grpo_loop.py --grad-accum '{grad_accum}' --batch-size '{micro_batch}' --variant kl-per-micro-batch
