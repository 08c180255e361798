"""``new_group(ranks, use_local_synchronization=True)`` made by its members alone, as its
documentation allows ("non-member ranks don't need to call into API"), then a group over the
world made by every rank. On torch 2.14.1 the members' group counter has moved one ahead of
the others' (``_process_group_name`` now counts hashed names too), so the world group gets
another name on rank 1 than on rank 0, its gloo rendezvous keys differ, and every rank waits
for ever; on 2.12.1 and 2.13.0 the second group is made and reduces.

    python findings/new_group_local_synchronization_counter.py   # hangs (torch 2.14.1) until
                                                                  # the group's 20 s time-out

Found by ``pytest --pyargs ddp_verify.conformance`` (test_collectives.py) on torch 2.14.1.
"""

import datetime
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)  # fmt: skip
    wait = datetime.timedelta(seconds=20)
    if rank == 1:  # its one member makes it; rank 0 never calls, as documented
        local = dist.new_group([1], use_local_synchronization=True, timeout=wait)
        dist.all_reduce(torch.ones(1), group=local)
    print(f"rank {rank}: making a group over the world", flush=True)
    world = dist.new_group([0, 1], timeout=wait)  # on 2.14.1: waits, then times out
    x = torch.ones(1)
    dist.all_reduce(x, group=world)
    print(f"rank {rank}: the world group reduces: {x.tolist()} (2.0 expected)", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free_port = s.getsockname()[1]
    mp.spawn(run, args=(free_port,), nprocs=2)
