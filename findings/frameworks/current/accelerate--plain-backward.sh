#!/bin/sh
# accelerate/plain-backward: loss.backward() for accelerator.backward(loss).
# What ddp-verify parity says at layout 1x4 (Python 3.11.7, torch 2.13.0+cpu, transformers 5.25.0, accelerate 1.16.0, lightning 2.6.6, trl 1.16.0):
#   the micro-batch losses summed, not divided by the accumulation steps: every sample counted 4x what it should
# Run from the repository root.
ddp-verify parity --layouts 1x4 --global-batch 16 --steps 2 -- python fixtures/scripts/accelerate_loop.py --grad-accum '{grad_accum}' --batch-size '{micro_batch}' --variant plain-backward
