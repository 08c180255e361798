"""How a layout's ranks start: a launcher named as users know it (``torchrun``, the default;
``accelerate``: ``accelerate launch``; ``fabric`` or ``lightning``: ``fabric run``; ``srun``),
followed by any options of its own, or a template of the user's. Each gives the commands that
start one layout (one per node simulated on this machine), the recorder's boot before the
script.

Example::

    >>> launcher = parse_launcher("torchrun --max-restarts 0")
    >>> launcher.name, launcher.extra
    ('torchrun', ('--max-restarts', '0'))
    >>> parse_launcher("torchrun").local
    True
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import shlex
import shutil
import sys
from pathlib import Path

from .layouts import Layout, LayoutError, per_node

__all__ = ["BOOT", "DEFAULT_LAUNCHER", "LAUNCHERS", "Launcher", "parse_launcher"]

# The default: torchrun on this machine, a rendezvous on a free port. Its agent runs through
# .agent: torchrun itself, less the interpreter's teardown at its end.
DEFAULT_LAUNCHER = (
    "{python} -m ddp_verify.parity.agent --standalone --nproc-per-node {world_size} "
    "--local-addr 127.0.0.1"
)
# The default across --nnodes agents on this machine: one torchrun agent per node, joined by
# the c10d rendezvous on a loopback port (a multi-node job simulated on one machine).
_AGENTS = (
    "{python} -m ddp_verify.parity.agent --nnodes {nnodes} --nproc-per-node {nproc_per_node} "
    "--rdzv-backend c10d --rdzv-endpoint 127.0.0.1:{port} --rdzv-id {run_id} "
    "--local-addr 127.0.0.1"
)
# What runs in each rank before the user's script: the recorder, then the script; a launcher
# that takes a script path only (fabric run) runs the same through its file.
BOOT = ("-m", "ddp_verify.parity.boot")
BOOT_SCRIPT = str(Path(__file__).with_name("boot_script.py"))
# The launchers known by name, and what each needs installed (a module, or a program).
LAUNCHERS = {
    "torchrun": "torch.distributed.run",
    "accelerate": "accelerate.commands.launch",
    "fabric": "lightning.fabric.cli",
    "lightning": "lightning.fabric.cli",
    "srun": "srun",
}
_INSTALL = {
    "accelerate": "pip install accelerate (or ddp_verify[frameworks])",
    "fabric": "pip install lightning (or ddp_verify[frameworks])",
    "lightning": "pip install lightning (or ddp_verify[frameworks])",
    "srun": "run ddp-verify inside a Slurm allocation (salloc), where srun is on PATH",
}


@dataclasses.dataclass(frozen=True)
class Launcher:
    """A launcher by ``name`` (one of :data:`LAUNCHERS`) with ``extra`` options of its own
    placed before the script, or ``name == "template"`` and the user's ``template``."""

    name: str
    extra: tuple[str, ...] = ()
    template: str = ""

    def __str__(self) -> str:
        return self.template if self.name == "template" else shlex.join((self.name, *self.extra))

    @property
    def local(self) -> bool:
        """Whether every rank runs on this machine (its stores then kept on loopback)."""
        return self.name in ("torchrun", "accelerate", "fabric", "lightning")

    def commands(
        self, layout: Layout, nnodes: int, *, port: int, run_id: str
    ) -> tuple[list[list[str]], dict[str, str]]:
        """The commands that start ``layout`` (each followed by the script), and what their
        environment adds: one command per node simulated on this machine, else one."""
        python = sys.executable
        # A layout of one rank runs on one node, whatever the others span.
        nnodes = 1 if layout.world_size == 1 else nnodes
        world, per = layout.world_size, per_node(layout, nnodes)
        if self.name == "template":
            text = os.path.expandvars(self.template).format(
                python=shlex.quote(python),
                world_size=world,
                nnodes=nnodes,
                nproc_per_node=per,
                port=port,
                run_id=run_id,
            )
            return [[*shlex.split(text), *BOOT]], {}
        extra = list(self.extra)
        if self.name == "torchrun":
            if world == 1 and not extra:
                # One process: what torchrun would give it, without an agent (seconds).
                return [[python, *BOOT]], {**_ONE_PROCESS, "MASTER_PORT": str(port)}
            if nnodes == 1:
                agent = DEFAULT_LAUNCHER.format(python=python, world_size=world)
                return [[*agent.split(), *extra, *BOOT]], {}
            agents = _AGENTS.format(
                python=python, nnodes=nnodes, nproc_per_node=per, port=port, run_id=run_id
            )
            return [[*agents.split(), *extra, *BOOT] for _ in range(nnodes)], {}
        if self.name == "accelerate":
            # accelerate launch's own flags; --multi_gpu is its torchrun path (refused at one
            # process, where it runs the script plainly, as on one GPU).
            flags = (
                f"-m accelerate.commands.launch --num_processes {world} --num_machines {nnodes} "
                f"--main_process_ip 127.0.0.1 --main_process_port {port}"
            ).split() + (["--multi_gpu"] if world > 1 else [])
            return [
                [python, *flags, "--machine_rank", str(node), *extra, *BOOT]
                for node in range(nnodes)
            ], {}
        if self.name in ("fabric", "lightning"):
            # fabric run's flags (the module's main is its `run` command); it starts a script
            # by path, so the boot goes as one.
            flags = (
                f"-m lightning.fabric.cli --devices {per} --num-nodes {nnodes} "
                f"--main-address 127.0.0.1 --main-port {port}"
            ).split()
            return [
                [python, *flags, "--node-rank", str(node), *extra, BOOT_SCRIPT]
                for node in range(nnodes)
            ], {}
        # srun starts every task itself, one a rank; the boot gives each torchrun's variables
        # from Slurm's (see .boot), the port chosen here.
        tasks = f"--nodes {nnodes} --ntasks {world} --ntasks-per-node {per} --kill-on-bad-exit=1"
        return [["srun", *tasks.split(), *extra, python, *BOOT]], {"MASTER_PORT": str(port)}


# torchrun's variables for a world of one process.
_ONE_PROCESS = {
    "RANK": "0",
    "LOCAL_RANK": "0",
    "WORLD_SIZE": "1",
    "LOCAL_WORLD_SIZE": "1",
    "GROUP_RANK": "0",
    "MASTER_ADDR": "127.0.0.1",
    "OMP_NUM_THREADS": "1",
}


def parse_launcher(text: str) -> Launcher:
    """``--launcher``'s value: a launcher's name and options of its own, or a template with
    ``{python}``, ``{world_size}``, ``{nnodes}``, ``{nproc_per_node}``, ``{port}`` and
    ``{run_id}``; :class:`~.layouts.LayoutError` where a named launcher is not installed.

    Example::

        >>> str(parse_launcher("torchrun --log-dir 'my logs'"))
        "torchrun --log-dir 'my logs'"
        >>> parse_launcher("{python} -m torch.distributed.run --nproc-per-node {world_size}").name
        'template'
    """
    if text == DEFAULT_LAUNCHER:
        return Launcher("torchrun")
    words = shlex.split(text)
    if not words:
        raise LayoutError(
            "--launcher is empty: name one of " + ", ".join(LAUNCHERS) + ", or give a template"
        )
    if "{" in text or words[0] not in LAUNCHERS:
        return Launcher("template", template=text)
    name = words[0]
    needs = LAUNCHERS[name]
    found = shutil.which(needs) if name == "srun" else _module_found(needs)
    if not found:
        raise LayoutError(f"--launcher {name}: {needs} is not installed here: {_INSTALL[name]}")
    return Launcher(name, tuple(words[1:]))


def _module_found(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False
