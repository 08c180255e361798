#!/bin/sh
# accelerate/prepared-scheduler: a scheduler given to accelerator.prepare.
# What ddp-verify parity says at layout 2x2 (Python 3.11.7, torch 2.13.0+cpu, transformers 5.25.0, accelerate 1.16.0, lightning 2.6.6, trl 1.16.0):
#   the optimizer's settings depend on the layout (step 1: lr 0.0025, the reference's 0.005, 0.5x; accelerate, as documented, steps a prepared scheduler once per process at each optimizer step (the batch grows with the processes): with the global batch fixed, give Accelerator(split_batches=True) the global batch, or step the scheduler yourself, unprepared, once per optimizer step): a learning-rate schedule or another setting stepped by micro-batch, by process or by samples seen, not by optimizer step
# Run from the repository root.
ddp-verify parity --layouts 2x2 --global-batch 16 --steps 2 -- python fixtures/scripts/accelerate_loop.py --grad-accum '{grad_accum}' --batch-size '{micro_batch}' --scheduler prepared
