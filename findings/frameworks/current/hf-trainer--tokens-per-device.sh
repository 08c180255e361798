#!/bin/sh
# hf-trainer/tokens-per-device: average_tokens_across_devices=False.
# What ddp-verify parity says at layout 2x2 (Python 3.11.7, torch 2.13.0+cpu, transformers 5.25.0, accelerate 1.16.0, lightning 2.6.6, trl 1.16.0):
#   gradients averaged over ranks by the world size, not weighted by each rank's tokens; a Hugging Face Trainer (and TRL's trainers, which are Trainers) does so by design with average_tokens_across_devices=False: set it True
# Run from the repository root.
ddp-verify parity --layouts 2x2 --global-batch 8 --steps 2 -- python fixtures/scripts/hf_trainer.py --grad-accum '{grad_accum}' --batch-size '{micro_batch}' --variant tokens-per-device
