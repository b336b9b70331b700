"""Run under mpiexec: set up instances and prove each instance's torch group is separate.

Arguments: INSTANCES [RANKS_PER_NODE|-] [DEVICE] (DEVICE: auto | cpu | cuda, default cpu)."""
from __future__ import annotations

import json
import sys

import torch
import torch.distributed as tdist

from hpcbench.common.dist import init_distributed


def main() -> None:
    instances = int(sys.argv[1])
    rpn = int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2] != "-" else None
    device = sys.argv[3] if len(sys.argv) > 3 else "cpu"
    env = init_distributed(instances=instances, ranks_per_node=rpn, device=device)
    t = torch.tensor([float(env.layout.world_rank)], device=env.device)
    tdist.all_reduce(t)
    # MPI instance comm and torch group must agree on membership
    mpi_sum = env.instance_comm.allreduce(env.layout.world_rank)
    row = {**env.layout.__dict__, "torch_sum": t.item(), "mpi_sum": mpi_sum,
           "torch_world": tdist.get_world_size(), "torch_rank": tdist.get_rank(),
           "threads": torch.get_num_threads(), "backend": env.torch_backend, "device": str(env.device),
           "tensor_device": str(t.device)}
    if env.device.type == "cuda":
        row["current_device"] = torch.cuda.current_device()
    rows = env.comm.gather(row, root=0)
    env.close()
    if env.layout.world_rank == 0:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
