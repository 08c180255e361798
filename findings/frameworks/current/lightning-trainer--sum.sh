#!/bin/sh
# lightning-trainer/sum: training_step returns the summed loss.
# What ddp-verify parity says at layout 1x4 (Python 3.11.7, torch 2.13.0+cpu, transformers 5.25.0, accelerate 1.16.0, lightning 2.6.6, trl 1.16.0):
#   the loss summed over each micro-batch's samples, not averaged: the gradient goes with the micro-batch's size: every sample counted 0.25x what it should
# Run from the repository root.
ddp-verify parity --layouts 1x4 --global-batch 8 --steps 2 -- python fixtures/scripts/lightning_trainer.py --grad-accum '{grad_accum}' --batch-size '{micro_batch}' --variant sum
