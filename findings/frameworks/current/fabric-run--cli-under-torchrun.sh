#!/bin/sh
# fabric-run/cli-under-torchrun: a script for fabric run (Fabric() from the CLI's flags) started by torchrun.
# What ddp-verify parity says at layout 2x2 (Python 3.11.7, torch 2.13.0+cpu, transformers 5.25.0, accelerate 1.16.0, lightning 2.6.6, trl 1.16.0):
#   the ranks of layout 2x2 never joined one process group (2 process(es) started, none called init_process_group): each trained alone, so the layout never ran as asked (a framework started under torchrun without a distributed strategy runs single-device in every rank: give it one, e.g. Fabric(strategy='ddp'), Trainer(strategy='ddp'), or init_process_group)
# Run from the repository root.
ddp-verify parity --layouts 2x2 --global-batch 16 --steps 2 -- python fixtures/scripts/fabric_loop.py --grad-accum '{grad_accum}' --batch-size '{micro_batch}' --configured-by cli
