"""Run under mpiexec: a Llama built on the meta device, sharded and initialised per shard equals the whole model.

    mpiexec -n N python tests/mpi_scripts/llama_meta_init.py TP

Every rank builds the whole model (seed 11, as the harness's single-device build does) and shards it with
``parallelize`` (FSDP2 over N / TP data-parallel ranks, tensor parallelism over TP), and builds the same layout
with ``build_sharded`` (meta device, ``to_empty``, per-shard init after the same seed). Rank 0 prints one JSON
line: how many parameters were compared, how many local shards differ (bitwise), how many gathered parameters
differ from the whole model's, the elements this rank allocated for parameters against the model's total, and
whether every parameter of the meta-built model is a DTensor with storage on the CPU.
"""
from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

from hpcbench.common.dist import init_distributed
from hpcbench.common.parallel import Degrees, Parallel
from torch.distributed.tensor import DTensor
from hpcbench.workloads.mlperf_training.llama31_8b.model import Llama, LlamaConfig
from hpcbench.workloads.mlperf_training.llama31_8b.parallelize import build_sharded, parallelize

# sizes that do not split evenly over 2 data-parallel ranks (vocabulary 66, feed-forward 52 / 2 = 26 per TP rank
# over 2 FSDP ranks = 13): FSDP2's padded shards are covered too
CFG = LlamaConfig(vocab_size=66, dim=32, layers=2, heads=4, kv_heads=2, ffn_dim=52, rope_original_context=16)
SEED = 11


def main() -> None:
    tp = int(sys.argv[1])
    env = init_distributed(device="cpu")
    par = Parallel(env, Degrees(tensor_parallel=tp))
    mesh = par.device_mesh()
    torch.manual_seed(SEED)
    whole = Llama(CFG)
    reference = {n: p.detach().clone() for n, p in whole.named_parameters()}
    sharded_whole = parallelize(whole, mesh)
    torch.manual_seed(SEED)
    meta_built = build_sharded(CFG, mesh, "cpu")
    shard_diff = gathered_diff = compared = 0
    local_elems = 0
    all_dtensor = True
    for (n, p), (m, q) in zip(sharded_whole.named_parameters(), meta_built.named_parameters()):
        assert n == m, (n, m)
        compared += 1
        all_dtensor &= isinstance(q, DTensor) and q.to_local().device.type == "cpu"
        if isinstance(q, DTensor):
            local_elems += q.to_local().numel()
            shard_diff += int(not torch.equal(p.to_local(), q.to_local()))
            gathered_diff += int(not torch.equal(q.full_tensor(), reference[n]))
        else:
            local_elems += q.numel()
            gathered_diff += int(not torch.equal(q, reference[n]))
    rope = torch.equal(sharded_whole.inv_freq, meta_built.inv_freq)
    total = sum(t.numel() for t in reference.values())
    counts = torch.tensor([shard_diff, gathered_diff], dtype=torch.int64)
    dist.all_reduce(counts)
    elems = torch.tensor([local_elems], dtype=torch.int64)
    dist.all_reduce(elems, op=dist.ReduceOp.MAX)
    if par.rank == 0:
        print(json.dumps({"rank": 0, "compared": compared, "shard_diff": int(counts[0]), "gathered_diff": int(counts[1]),
                          "max_local_elems": int(elems[0]), "total_elems": total, "all_dtensor": all_dtensor,
                          "rope_equal": rope}), flush=True)
    env.barrier()  # both ranks done with the group before it is torn down, and after (as the dlrm scripts do)
    env.close()
    env.barrier()


if __name__ == "__main__":
    main()
