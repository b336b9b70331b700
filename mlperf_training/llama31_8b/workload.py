"""Llama 3.1 8B pretraining on the harness (training suite, ruleset training 6.0.0).

Data: Megatron indexed datasets, GPT samples of ``seq_len + 1`` tokens in the seeded Megatron order
(``dataset.py``). Model: Llama 3.1 (``model.py``), sharded by ``distribute`` with FSDP2 over the data-parallel
ranks and tensor parallelism over ``model.tensor_parallel`` (``parallelize.py``); the harness trains it with
:mod:`hpcbench.common.sharded` (``shards_parameters``). Loss: the summed next-token cross entropy of the rank's
batch over its token count (the harness divides by the instance's count, so the gradient is that of the global
mean). Evaluation: ``eval_accuracy`` = log perplexity, the mean next-token cross entropy (nats) over every token
of the evaluation samples - (summed loss, token count) added over batches and ranks (ranks of a tensor-parallel
group add the same batch twice to both, which leaves the ratio as it is). Weight decay spares the 1-D tensors
(RMSNorm weights), as Megatron's parameter groups do.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from hpcbench.common.workload import DataShard, EpochLoader, Workload

from . import BENCHMARK
from .config import LlamaConfig
from .dataset import LlamaData
from .synth import LlamaDatagen

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from torch import nn

    from hpcbench.common.parallel import Degrees, Parallel


class LlamaWorkload(LlamaDatagen, Workload[LlamaConfig]):
    record = BENCHMARK
    config_cls = LlamaConfig
    shards_parameters: ClassVar[bool] = True

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__(cfg)
        import torch

        self._init_rng = torch.random.get_rng_state()  # replaced by build_model's (the harness seeds before it)
        d = cfg.data
        self._spec = LlamaData(d.seq_len, cfg.model.vocab_size, cfg.train.seed, d.train_samples, d.eval_samples,
                               d.train_blend, d.eval_order, d.eval_index_samples, d.index_cache)

    def dataset(self) -> LlamaData:
        return self._spec

    def train_loader(self, shard: DataShard) -> EpochLoader:
        self._spec.seed = shard.seed  # the instance's seed fixes the Megatron order (set before the split opens)
        return super().train_loader(shard)

    def eval_loader(self, shard: DataShard) -> EpochLoader:
        self._spec.seed = shard.seed  # and the evaluation set's (data.eval_order = "reference"), also on an
        return super().eval_loader(shard)  # evaluation rank, which opens no training split

    # model ----------------------------------------------------------------------------------
    def model_config(self) -> Any:
        from .model import LlamaConfig as Shape

        m = self.cfg.model
        return Shape(vocab_size=m.vocab_size, dim=m.dim, layers=m.layers, heads=m.heads, kv_heads=m.kv_heads,
                     ffn_dim=m.ffn_dim, rope_theta=m.rope_theta)

    def build_model(self) -> "nn.Module":
        """The model on the meta device (no storage): :meth:`distribute` shards it and gives each rank storage
        for its shards only, initialised from the generator state the harness seeded here (the values of a
        whole model built with that seed)."""
        import torch

        from .model import Llama

        self._init_rng = torch.random.get_rng_state()
        with torch.device("meta"):
            return Llama(self.model_config())

    def parallel_degrees(self) -> "Degrees":
        from hpcbench.common.parallel import Degrees

        return Degrees(tensor_parallel=self.cfg.model.tensor_parallel, model_parallel=True,
                       model_parallel_what="parameters sharded over the ranks (FSDP2)")

    def distribute(self, model: "nn.Module", parallel: "Parallel") -> "nn.Module":
        import torch

        from .parallelize import materialize, parallelize

        model = parallelize(model, parallel.device_mesh(), self.cfg.model.activation_checkpointing)  # type: ignore[arg-type]
        if not any(p.is_meta for p in model.parameters()):
            return model
        gen = torch.Generator()
        gen.set_state(self._init_rng)
        return materialize(model, parallel.device, gen)  # type: ignore[arg-type]

    def no_weight_decay(self, name: str) -> bool:
        return name.endswith("norm.weight")

    def forward(self, model: "nn.Module", batch: "torch.Tensor") -> "torch.Tensor":
        return model(batch[:, :-1])

    def loss(self, outputs: "torch.Tensor", batch: "torch.Tensor") -> "torch.Tensor":
        from .model import token_nll_sum

        return token_nll_sum(outputs, batch[:, 1:])

    def loss_count(self, batch: "torch.Tensor") -> "torch.Tensor":
        return batch.new_full((), batch[:, 1:].numel())

    # evaluation -----------------------------------------------------------------------------
    def eval_sums(self, outputs: "torch.Tensor", batch: "torch.Tensor") -> Mapping[str, "torch.Tensor"]:
        from .model import token_nll_sum

        return {"nll": token_nll_sum(outputs, batch[:, 1:]), "tokens": self.loss_count(batch)}

    def metric(self, sums: Mapping[str, float]) -> float:
        return sums["nll"] / max(1.0, sums["tokens"])

    def max_sequence_length(self) -> int:
        return self.cfg.data.seq_len

    def hyperparameters(self) -> dict[str, Any]:
        # init_checkpoint_step: the reference logs 0 (it trains from random weights, no checkpoint)
        return {**super().hyperparameters(), "max_steps": self.cfg.model.max_steps, "init_checkpoint_step": 0}

