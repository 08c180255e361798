"""Where a launched job says this process stands: torchrun's and Slurm's environments, read
into one :class:`Launched` (rank, world size, local rank, rendezvous address).

SPMD mode builds on this: under a launcher, each launched process *is* a rank, and its process
group comes from here (:mod:`ddp_verify.world.spmd`). Nothing in this module starts or joins
anything.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from .naming import option, public

# torchrun (and torch.distributed.launch) set these on every process it starts.
TORCHRUN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
# srun sets these; the rendezvous address is the job's first host.
SLURM = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_JOB_NODELIST")
# Slurm gives no port: one is derived from the job id, the same on every task of the job.
SLURM_PORT_BASE, SLURM_PORT_SPAN = 15000, 20000


@public
class LaunchError(ValueError):
    """The launcher's environment is incomplete or contradicts itself; the message says what.

    Example::

        >>> try:
        ...     resolve("spmd", {})
        ... except LaunchError as error:
        ...     print(str(error)[:41])
        SPMD mode (launch mode spmd) needs a laun
    """


@dataclasses.dataclass(frozen=True)
class Launched:
    """This process's place in a launched job.

    Example::

        launched = detect(os.environ)
        if launched is not None:
            dist.init_process_group("gloo", init_method=launched.init_method,
                                    rank=launched.rank, world_size=launched.world_size)
    """

    launcher: str
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    # How many nodes (torchrun agents, Slurm nodes) the job spans.
    nodes: int = 1

    @property
    def init_method(self) -> str:
        return f"tcp://{self.master_addr}:{self.master_port}"


def detect(environ: Mapping[str, str]) -> Launched | None:
    """The launched job this process belongs to, from torchrun's variables (first) or
    Slurm's; None outside a launcher. :class:`LaunchError` when the variables are there but
    do not add up (a rank outside the world, a missing address, a bad number).

    Example::

        >>> detect({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1",
        ...         "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}).rank
        1
    """
    if "RANK" in environ and "WORLD_SIZE" in environ:
        return _checked(
            "torchrun",
            _number(environ, "RANK"),
            _number(environ, "WORLD_SIZE"),
            _number(environ, "LOCAL_RANK", default=_number(environ, "RANK")),
            _required(environ, "MASTER_ADDR", "torchrun"),
            _number(environ, "MASTER_PORT"),
            _number(environ, "GROUP_WORLD_SIZE", default=1),
        )
    if "SLURM_PROCID" in environ and "SLURM_NTASKS" in environ:
        nodes = _required(environ, "SLURM_JOB_NODELIST", "srun")
        port = environ.get("MASTER_PORT")
        job = _number(environ, "SLURM_JOB_ID", default=0)
        return _checked(
            "slurm",
            _number(environ, "SLURM_PROCID"),
            _number(environ, "SLURM_NTASKS"),
            _number(environ, "SLURM_LOCALID", default=0),
            environ.get("MASTER_ADDR") or first_host(nodes),
            int(port) if port else SLURM_PORT_BASE + job % SLURM_PORT_SPAN,
            _number(
                environ, "SLURM_NNODES", default=_number(environ, "SLURM_JOB_NUM_NODES", default=1)
            ),
        )
    return None


def resolve(mode: str, environ: Mapping[str, str]) -> Launched | None:
    """The launched job to run as, for a launch ``mode``: ``auto`` (the default) runs as the
    launched job when there is one, ``fork`` never does (worlds are forked here), ``spmd``
    insists. None means fork mode.

    Example::

        >>> resolve("fork", {"RANK": "0", "WORLD_SIZE": "2"}) is None
        True
    """
    if mode == "fork":
        return None
    launched = detect(environ)
    if launched is None and mode == "spmd":
        raise LaunchError(
            "SPMD mode (launch mode spmd) needs a launcher's environment, and this process has "
            "none: start it with torchrun (torchrun --nproc-per-node 4 -m pytest ..., or -m "
            "ddp_verify ...) or srun, or set RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and "
            f"MASTER_PORT yourself; {option('launch', 'fork')} forks the ranks here instead"
        )
    return launched


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list, as ``scontrol show hostnames`` would give it.

    Example::

        >>> first_host("gpu[07-09,12],cpu3"), first_host("node001")
        ('gpu07', 'node001')
    """
    first = _split_top_level(nodelist.strip())[0] if nodelist.strip() else ""
    match = re.fullmatch(r"([^\[\]]*)\[([^\]]+)\](.*)", first)
    if match is None:
        if not first or "[" in first or "]" in first:
            raise LaunchError(f"cannot read the Slurm node list {nodelist!r}")
        return first
    prefix, ranges, suffix = match.groups()
    start = ranges.split(",")[0].split("-")[0]
    return f"{prefix}{start}{suffix}"


def _split_top_level(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in text:
        depth += char == "["
        depth -= char == "]"
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return parts


def _checked(
    launcher: str, rank: int, world_size: int, local_rank: int, addr: str, port: int, nodes: int
) -> Launched:
    if world_size < 1 or not 0 <= rank < world_size:
        raise LaunchError(
            f"{launcher} says rank {rank} of a world of {world_size}: a rank must be at least 0 "
            "and below the world size"
        )
    if local_rank < 0 or not 0 < port < 65536:
        raise LaunchError(f"{launcher} says local rank {local_rank}, port {port}: impossible")
    return Launched(launcher, rank, world_size, local_rank, addr, port, max(1, nodes))


def _required(environ: Mapping[str, str], name: str, launcher: str) -> str:
    value = environ.get(name, "")
    if not value:
        raise LaunchError(f"{launcher}'s environment has no {name}")
    return value


def _number(environ: Mapping[str, str], name: str, default: int | None = None) -> int:
    text = environ.get(name)
    if text is None or text == "":
        if default is None:
            raise LaunchError(f"the launcher's environment has no {name}")
        return default
    try:
        return int(text)
    except ValueError:
        raise LaunchError(
            f"{name}={text!r} in the launcher's environment is not a number"
        ) from None
