"""The Llama model as a rank holds it: tensor parallelism over the mesh's ``tp`` dimension, FSDP2 over its ``dp``
dimension, activation checkpointing per block.

* **Tensor parallelism** (``torch.distributed.tensor.parallel``), Megatron's split: in each block the query,
  key, value, gate and up projections are split by output columns (each rank runs ``heads / T`` query and
  ``kv_heads / T`` key-value heads, ``ffn_dim / T`` hidden units), the attention output and down projections
  by input rows (their outputs summed over the group); the embedding is split by vocabulary rows (outputs
  summed), the output projection by vocabulary columns with the logits gathered. RMSNorm weights stay whole
  on every rank of the group (their inputs are replicated, so their gradients agree).
* **FSDP2** (``torch.distributed.fsdp.fully_shard``): each block is one unit, the embedding/norm/output the root
  unit; parameters, gradients and optimizer state are sharded over the data-parallel ranks (a tensor-parallel
  shard is sharded again: 2-D DTensors). Gradients are reduce-scattered and averaged over ``dp``.
* **Activation checkpointing**: a block's activations are recomputed in the backward pass (``Block.checkpointed``).
* **Meta-device construction** (:func:`build_sharded`): the model is built on the meta device (no memory), sharded
  as above, materialised with ``to_empty`` on the rank's device and initialised shard by shard
  (:meth:`Llama.init_weights`): each rank allocates only its shards, and the values equal those of a whole model
  built with the same seed (one parameter is drawn whole at a time on the CPU).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .model import Llama, LlamaConfig


def tensor_parallel_plan(model: Llama, tp: int) -> None:
    """Refuse a degree that does not split the heads and widths (named keys)."""
    from hpcbench.common.errors import ConfigError

    c = model.cfg
    for what, n in (("model.kv_heads", c.kv_heads), ("model.heads", c.heads), ("model.ffn_dim", c.ffn_dim),
                    ("model.vocab_size", c.vocab_size)):
        if n % tp:
            raise ConfigError(f"config key 'model.tensor_parallel' = {tp} must divide {what} = {n}")


def apply_tensor_parallel(model: Llama, tp_mesh: Any) -> None:  # noqa: ANN401
    from torch.distributed.tensor import Replicate, Shard  # noqa: F401
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    tensor_parallel_plan(model, tp_mesh.size())
    parallelize_module(model, tp_mesh, {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate()),
        "output": ColwiseParallel(output_layouts=Replicate()),
    })
    for block in model.layers:
        parallelize_module(block, tp_mesh, {
            "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(),
            "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(),
        })


def apply_fsdp(model: Llama, dp_mesh: Any, reshard_after_forward: bool = True,  # noqa: ANN401
               mp_policy: Any = None) -> None:  # noqa: ANN401
    from torch.distributed.fsdp import fully_shard

    kwargs: dict[str, Any] = {"mesh": dp_mesh, "reshard_after_forward": reshard_after_forward}
    if mp_policy is not None:
        kwargs["mp_policy"] = mp_policy
    for block in model.layers:
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)


def parallelize(model: Llama, mesh: Any, activation_checkpointing: bool = False,  # noqa: ANN401
                reshard_after_forward: bool = True, mp_policy: Any = None) -> nn.Module:  # noqa: ANN401
    """``model`` (built the same, seeded, on every rank) as this rank holds it on ``mesh`` (``("dp", "tp")``;
    None: one process). Tensor parallelism where ``tp`` > 1, FSDP2 where there is more than one rank."""
    for block in model.layers:
        block.checkpointed = activation_checkpointing
    if mesh is None:
        return model
    tp, dp = mesh["tp"], mesh["dp"]
    if tp.size() > 1:
        apply_tensor_parallel(model, tp)
    if dp.size() > 1 or tp.size() > 1:
        apply_fsdp(model, dp, reshard_after_forward, mp_policy)
    return model


def build_sharded(cfg: LlamaConfig, mesh: Any, device: torch.device | str,  # noqa: ANN401
                  activation_checkpointing: bool = False, generator: torch.Generator | None = None,
                  dtype: torch.dtype | None = None, reshard_after_forward: bool = True,
                  mp_policy: Any = None) -> nn.Module:  # noqa: ANN401
    """The model of ``cfg`` as this rank holds it on ``mesh`` (None: one process), never whole in memory: built
    on the meta device, parallelised, materialised on ``device`` and initialised per shard from ``generator``
    (else the global CPU generator) - equal to ``parallelize(Llama(cfg).to(dtype), mesh)`` after the same seed."""
    with torch.device("meta"):
        model = Llama(cfg)
    if dtype is not None:
        model = model.to(dtype)
    return materialize(parallelize(model, mesh, activation_checkpointing, reshard_after_forward, mp_policy),
                       device, generator)


def materialize(model: Llama, device: torch.device | str, generator: torch.Generator | None = None) -> Llama:
    """A (parallelised) model on the meta device given storage on ``device`` and its initial values."""
    model.to_empty(device=device)
    model.init_weights(generator)
    return model
