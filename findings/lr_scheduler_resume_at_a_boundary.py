"""A scheduler built with ``last_epoch`` to resume a run (the optimizer loaded from the run's
checkpoint, so its learning rate is the one the run stopped at) steps once in its constructor.
pytorch#102261 made that step keep the loaded learning rate for ExponentialLR ("we don't want
_initial_step to update the lr one more step ahead of itself"); StepLR, MultiStepLR and
ConstantLR still apply their change a second time where the run stopped on an epoch that
changes it: resumed at epoch 3 of StepLR(step_size=3, gamma=0.5), the learning rate is
0.025 where the run has 0.05, and it stays a factor of 2 low from then on.

    python findings/lr_scheduler_resume_at_a_boundary.py   # StepLR: 0.025, the run: 0.05

Found by ``pytest --pyargs ddp_verify.conformance`` (test_lr_schedulers.py).
"""

import torch

if __name__ == "__main__":
    p = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([p], lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
    for _ in range(3):  # the run: three epochs, then a checkpoint
        optimizer.step()
        scheduler.step()
    saved = optimizer.state_dict()
    print(f"the run at epoch {scheduler.last_epoch}: lr {optimizer.param_groups[0]['lr']}")

    resumed = torch.optim.SGD([p], lr=0.1)
    resumed.load_state_dict(saved)  # lr 0.05, initial_lr 0.1
    again = torch.optim.lr_scheduler.StepLR(resumed, step_size=3, gamma=0.5, last_epoch=2)
    print(f"resumed at epoch {again.last_epoch}: lr {resumed.param_groups[0]['lr']}")
