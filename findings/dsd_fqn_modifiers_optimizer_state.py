"""A module whose state dict hides a level of its keys (torchtune's FusionEmbedding: a state-dict
hook shows ``table.weight`` as ``weight``) and tells the state-dict API so by ``_fqn_modifiers``
(``StateDictOptions.dsd_fqn_modifiers``): the model state dict round trip works, the
optimizer's does not. get_state_dict keys the hidden parameter's optimizer state by its full
name (``lookup.table.weight``, from ``named_parameters``); set_state_dict looks for it under
the shown name (``lookup.weight``, from its walk that skips the hidden level): strict, it
refuses ("Missing optimizer state for parameter 'lookup.weight'"); with ``strict=False`` the
state is silently not loaded.

And a method named otherwise, as ``dsd_fqn_modifiers`` allows, is honoured by the load and
not by get_state_dict, which asks ``_fqn_modifiers`` whatever the option names: the shown
key's owner is looked for without the hidden level (AttributeError: 'Fused' object has no
attribute 'weight').

    python findings/dsd_fqn_modifiers_optimizer_state.py            # raises (torch 2.13.0)
    python findings/dsd_fqn_modifiers_optimizer_state.py --lenient  # its state dropped
    python findings/dsd_fqn_modifiers_optimizer_state.py --named    # get_state_dict raises

Found by ``pytest --pyargs ddp_verify.conformance`` (test_state_dict.py).
"""

import socket
import sys

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)


class Fused(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Linear(4, 4, bias=False)
        self.fusion = torch.nn.Linear(4, 4, bias=False)
        self._register_state_dict_hook(Fused._shown)
        self._register_load_state_dict_pre_hook(Fused._hidden, with_module=True)

    def _fqn_modifiers(self) -> dict[str, str]:
        return {"weight": "table"}

    # The same, under the name --named gives the option.
    _hidden_levels = _fqn_modifiers

    @staticmethod
    def _shown(module, state, prefix, *_):
        state[f"{prefix}weight"] = state.pop(f"{prefix}table.weight")

    @staticmethod
    def _hidden(module, state, prefix, *_):
        if f"{prefix}weight" in state:
            state[f"{prefix}table.weight"] = state.pop(f"{prefix}weight")

    def forward(self, x):
        return self.table(x) + self.fusion(x)


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lookup = Fused()

    def forward(self, x):
        return self.lookup(x)


def trained():
    model = Model()
    optim = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.ones(2, 4)).sum().backward()
    optim.step()
    return model, optim


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    torch.manual_seed(0)
    named = "--named" in sys.argv
    if named:
        del Fused._fqn_modifiers
    options = StateDictOptions(
        strict="--lenient" not in sys.argv,
        dsd_fqn_modifiers="_hidden_levels" if named else "_fqn_modifiers",
    )
    model, optim = trained()
    model_state, optim_state = get_state_dict(model, optim, options=options)
    print("model state keys:", list(model_state))
    print("optimizer state keys:", list(optim_state["state"]))
    fresh, fresh_optim = trained()
    set_state_dict(
        fresh,
        fresh_optim,
        model_state_dict=model_state,
        optim_state_dict=optim_state,
        options=options,
    )
    # The table's weight is the optimizer's parameter 0: its state is gone after the load.
    print("the hidden parameter's state loaded:", 0 in fresh_optim.state_dict()["state"])
    dist.destroy_process_group()
