#!/bin/sh
# accelerate/plain-backward: loss.backward() for accelerator.backward(loss).
# What ddp-verify parity says at layout 1x4 (Python 3.11.7, torch 2.13.0+cpu, transformers 4.45.2, accelerate 0.34.2, lightning 2.4.0, trl absent):
#   the micro-batch losses summed, not divided by the accumulation steps: every sample counted 4x what it should
# Run from the repository root.
ddp-verify parity --layouts 1x4 --global-batch 16 --steps 2 -- python fixtures/scripts/accelerate_loop.py --grad-accum '{grad_accum}' --batch-size '{micro_batch}' --variant plain-backward
