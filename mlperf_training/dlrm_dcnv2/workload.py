"""DLRM-DCNv2 on the harness (training suite, ruleset training 5.1.0): data, model, loss, exact AUROC, MLPerf keys.

Model parallelism: :meth:`distribute` deals the tables with at least ``model.shard_min_rows`` rows
to the instance's ranks (``hybrid.ShardingPlan``; all-to-all of ids and pooled embeddings) and
keeps the rest replicated; :meth:`local_parameters` tells the harness which parameters are the
rank's own, so its gradient sync all-reduces only the data-parallel ones. With ``model.sparse_grads``
(the default) the owned tables have sparse gradients, live outside the flat buffer
(:meth:`sparse_parameters`) and are updated by the harness's row-wise Adagrad. Evaluation keeps every
validation sample's score and computes the exact AUROC over the instance (``auroc.distributed_auroc``:
only the smaller class's scores are gathered) as ``eval_accuracy``.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from hpcbench.common.workload import Workload

from . import BENCHMARK
from .config import DLRMConfig
from .criteo import MULTI_HOT_SIZES
from .dataset import Batch, CriteoData
from .synth import DLRMDatagen

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from hpcbench.common.parallel import Collectives, Degrees, Parallel
    from torch import nn


class DLRMWorkload(DLRMDatagen, Workload[DLRMConfig]):
    record = BENCHMARK
    config_cls = DLRMConfig
    eval_kind: ClassVar[str] = "samples"

    def __init__(self, cfg: DLRMConfig) -> None:
        super().__init__(cfg)
        self._spec = CriteoData(MULTI_HOT_SIZES, cfg.model.cardinalities, cfg.data.days)

    def dataset(self) -> CriteoData:
        return self._spec

    # model ----------------------------------------------------------------------------------
    def model_config(self) -> Any:
        from .model import ModelConfig

        m = self.cfg.model
        return ModelConfig(cardinalities=tuple(m.cardinalities), embedding_dim=m.embedding_dim,
                           bottom_mlp=tuple(m.bottom_mlp), top_mlp=tuple(m.top_mlp), dcn_layers=m.dcn_layers,
                           dcn_low_rank=m.dcn_low_rank)

    def build_model(self) -> "nn.Module":
        from .model import DLRMDCNv2

        return DLRMDCNv2(self.model_config())

    def parallel_degrees(self) -> "Degrees":
        """Model parallel when a table is large enough to shard (``model.shard_min_rows``) or has sparse
        gradients: those parameters live on one rank (or outside the flat buffer)."""
        from hpcbench.common.parallel import Degrees

        m = self.cfg.model
        sharded = any(c >= m.shard_min_rows for c in m.cardinalities) or m.sparse_grads
        return Degrees(model_parallel=sharded,
                       model_parallel_what="embedding tables sharded over the ranks or with sparse gradients "
                                           "(model.shard_min_rows, model.sparse_grads)")

    def distribute(self, model: "nn.Module", parallel: "Parallel") -> "nn.Module":
        """Shard the large tables over the ranks; with ``model.sparse_grads`` the tables this rank owns
        (on one rank: the large ones) get sparse gradients."""
        from .hybrid import ShardingPlan, parallelize, use_sparse_grads

        rank, world = parallel.rank, parallel.size

        plan = ShardingPlan.build(self.cfg.model.cardinalities, world, self.cfg.model.shard_min_rows)
        if world > 1 and any(o is not None for o in plan.owners):
            model = parallelize(model, plan, rank)  # type: ignore[arg-type]
        elif world > 1:
            return model  # nothing large enough to shard: plain data parallel, dense gradients
        if self.cfg.model.sparse_grads:
            use_sparse_grads(model, plan, rank)  # type: ignore[arg-type]
        return model

    def local_parameters(self, model: "nn.Module") -> list["nn.Parameter"]:
        from .hybrid import model_parallel_parameters

        return model_parallel_parameters(model)

    def sparse_parameters(self, model: "nn.Module") -> list["nn.Parameter"]:
        from .hybrid import sparse_parameters

        return sparse_parameters(model)

    def forward(self, model: "nn.Module", batch: Batch) -> "torch.Tensor":
        dense, _, sparse = batch
        return model(dense, sparse)

    def loss(self, outputs: "torch.Tensor", batch: Batch) -> "torch.Tensor":
        """Binary cross-entropy of the click logits, summed over the batch."""
        import torch.nn.functional as F

        return F.binary_cross_entropy_with_logits(outputs.float(), batch[1], reduction="sum")

    def loss_count(self, batch: Batch) -> "torch.Tensor":
        import torch

        return batch[1].new_full((), float(batch[1].numel()), dtype=torch.float32)

    # evaluation -----------------------------------------------------------------------------
    def eval_samples(self, outputs: "torch.Tensor", batch: Batch) -> Mapping[str, "torch.Tensor"]:
        return {"scores": outputs.float(), "labels": batch[1].to(outputs.device)}

    def metric_of_samples(self, kept: Mapping[str, "torch.Tensor"], parallel: "Collectives") -> float:
        """Exact AUROC of every validation sample of the instance (ties count one half)."""
        from .auroc import auroc, distributed_auroc

        scores, labels = kept["scores"], kept["labels"]
        return auroc(scores, labels) if parallel.size == 1 else distributed_auroc(scores, labels, parallel)

    def eval_sums(self, outputs: Any, batch: Any) -> Mapping[str, "torch.Tensor"]:
        raise NotImplementedError("dlrm_dcnv2 evaluates from every sample's score (eval_kind = 'samples')")

    def metric(self, sums: Mapping[str, float]) -> float:
        raise NotImplementedError("dlrm_dcnv2 evaluates from every sample's score (eval_kind = 'samples')")

