"""torch.distributed.checkpoint.load with DefaultLoadPlanner(flatten_state_dict=False) (and
flatten_sharded_tensors left at its default, True) loads the checkpoint's tensors but not its
plain values: they are written into the copy of the state dict the planner made while
flattening sharded tensors, and the caller's dict keeps what it held before the load. With
flatten_sharded_tensors=False, or flatten_state_dict=True, they load.

    python findings/dcp_unflattened_load_drops_plain_values.py   # step: 0, saved 5 (torch 2.13.0)

Found by ``pytest --pyargs ddp_verify.conformance`` (test_checkpoint.py).
"""

import tempfile

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultLoadPlanner, DefaultSavePlanner

if __name__ == "__main__":
    directory = tempfile.mkdtemp()
    dcp.save({"w": torch.ones(2), "step": 5}, checkpoint_id=directory, no_dist=True,
             planner=DefaultSavePlanner(flatten_state_dict=False))  # fmt: skip
    for sharded in (True, False):
        state = {"w": torch.zeros(2), "step": 0}
        planner = DefaultLoadPlanner(flatten_state_dict=False, flatten_sharded_tensors=sharded)
        dcp.load(state, checkpoint_id=directory, no_dist=True, planner=planner)
        print(f"flatten_sharded_tensors={sharded}: w {state['w'].tolist()}, "
              f"step: {state['step']}, saved 5")  # fmt: skip
