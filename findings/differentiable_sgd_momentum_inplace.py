"""SGD(differentiable=True, momentum=0.5) with a learning rate that requires grad (a
hypergradient, as learned-optimizer and meta-learning code takes): after one step the
derivative by the learning rate is there; after two, backward fails with "one of the
variables needed for gradient computation has been modified by an inplace operation". The
step's ``param.addcmul_(grad, lr, value=-1)`` saves the momentum buffer for the learning
rate's derivative, and the next step updates that buffer in place (``buf.mul_(momentum)``).
Without momentum it works.

    python findings/differentiable_sgd_momentum_inplace.py   # fails at 2 steps (torch 2.13.0)

Found by ``pytest --pyargs ddp_verify.conformance`` (test_optimizer_options.py).
"""

import torch

if __name__ == "__main__":
    for momentum in (0.0, 0.5):
        for steps in (1, 2):
            lr = torch.tensor(0.05, dtype=torch.float64, requires_grad=True)
            param = torch.ones(3, dtype=torch.float64).clone()
            optimizer = torch.optim.SGD([param], lr=lr, momentum=momentum, differentiable=True)
            try:
                for k in range(steps):
                    param.grad = torch.full((3,), float(k + 1), dtype=torch.float64)
                    optimizer.step()
                (derivative,) = torch.autograd.grad(param.sum(), lr)
                print(f"momentum {momentum}, {steps} step(s): d/dlr = {derivative.item()}")
            except RuntimeError as exc:
                print(f"momentum {momentum}, {steps} step(s): {str(exc)[:100]}")
