"""Adam(differentiable=True, amsgrad=True, weight_decay=0.1) with a learning rate that
requires grad: with weight decay in the gradient the second moments depend on the learning
rate (as they do on anything differentiated whenever gradients depend on the parameters),
and backward over three steps fails with "modified by an inplace operation": the running
maximum is written back in place after torch.maximum saved it. Without amsgrad it works.

    python findings/differentiable_adam_amsgrad_inplace.py   # RuntimeError (torch 2.13.0)

Found by ``pytest --pyargs ddp_verify.conformance`` (test_optimizer_options.py).
"""

import torch

if __name__ == "__main__":
    for amsgrad in (False, True):
        lr = torch.tensor(0.05, dtype=torch.float64, requires_grad=True)
        param = torch.ones(3, dtype=torch.float64).clone()
        optimizer = torch.optim.Adam([param], lr=lr, amsgrad=amsgrad, weight_decay=0.1,
                                     differentiable=True)  # fmt: skip
        try:
            for k in range(3):
                param.grad = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64) * (-1) ** k
                optimizer.step()
            (derivative,) = torch.autograd.grad(param.sum(), lr)
            print(f"amsgrad={amsgrad}: d/dlr = {derivative.item()}")
        except RuntimeError as exc:
            print(f"amsgrad={amsgrad}: {str(exc)[:100]}")
