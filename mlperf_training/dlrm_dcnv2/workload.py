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

import argparse
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from hpcbench.common.errors import ConfigError
from hpcbench.common.workload import Workload

from . import BENCHMARK
from .config import DLRMConfig
from .criteo import CARDINALITIES, MULTI_HOT_SIZES
from .dataset import Batch, CriteoData

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from hpcbench.common.parallel import Collectives, Degrees, Parallel
    from torch import nn


class DLRMWorkload(Workload[DLRMConfig]):
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

    # synthetic data -------------------------------------------------------------------------
    @classmethod
    def add_datagen_args(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--days", type=int, default=4, help="days D: D-1 train days and one eval day (MLPerf: 24)")
        parser.add_argument("--rows-per-day", type=int, default=32768, help="rows of each day")
        parser.add_argument("--cardinalities", default="reference",
                            help="'reference' (the MLPerf table sizes, 40M-row tables included) or 26 "
                                 "comma-separated table sizes; fewer are repeated to 26. The model's "
                                 "model.cardinalities must be the same")
        parser.add_argument("--quiet", action="store_true", help="no line per day")

    @classmethod
    def embedded_datagen_args(cls) -> list[str]:
        """The dataset the ``mini`` preset is tuned on (see configs/mini.toml)."""
        return ["--days", "4", "--rows-per-day", "32768", "--cardinalities", "200,100,50,20"]

    @classmethod
    def datagen(cls, args: argparse.Namespace) -> None:
        from .synth import generate

        cards = parse_cardinalities(args.cardinalities)
        if args.days < 2 or args.rows_per_day < 2:
            raise ConfigError(f"--days must be >= 2 and --rows-per-day >= 2, got {args.days} and {args.rows_per_day}")
        nbytes = generate(args.out, args.days, args.rows_per_day, cards, seed=args.seed,
                          workers=max(1, args.workers), progress=not args.quiet)
        print(f"wrote {args.days} days x {args.rows_per_day} rows of Criteo multi-hot data "
              f"({nbytes / 2**20:.1f} MiB) to {args.out}")


def parse_cardinalities(text: str) -> tuple[int, ...]:
    if text == "reference":
        return CARDINALITIES
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--cardinalities: expected 'reference' or comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1 or len(values) > len(CARDINALITIES):
        raise ConfigError(f"--cardinalities: 1 to {len(CARDINALITIES)} sizes >= 1, got {text!r}")
    return tuple((values * len(CARDINALITIES))[: len(CARDINALITIES)])
