"""``GradScaler.update(new_scale)`` documents ``new_scale`` as "a float or a 1-element
torch.FloatTensor", but the scale it keeps is 0-dim, and ``copy_`` does not broadcast a
tensor of shape (1,) into it: the one-element tensor of shape (1,) is refused with a
RuntimeError. A float, or a 0-dim tensor, sets the scale.

    python findings/grad_scaler_update_one_element_tensor.py   # 4.0, then the RuntimeError

Found by ``pytest --pyargs ddp_verify.conformance`` (test_grad_scaler.py).
"""

import torch

if __name__ == "__main__":
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale(torch.ones(()))  # the scale is made on first use
    scaler.update(torch.tensor(4.0))
    print(f"0-dim tensor: the scale is {scaler.get_scale()}")
    scaler.update(torch.tensor([4.0]))  # RuntimeError: output with shape [] doesn't match ...
