"""DLRM-DCNv2 config: the shared run sections plus ``data`` and ``model`` (sizes default to the reference's)."""
from __future__ import annotations

from dataclasses import dataclass, field

from hpcbench.common.errors import ConfigError
from hpcbench.common.runconfig import DataConfig, RunConfig

from .criteo import CARDINALITIES, NUM_SPARSE


@dataclass
class DLRMDataConfig(DataConfig):
    """``root`` is one folder of day files (``day_<d>_{dense,labels}.npy``, ``day_<d>_sparse_multi_hot.npz``);
    train = days 0 .. D-2, validation = the first half of day D-1 (as the reference)."""

    days: int = 0  # D; 0: every day found in the root (days 0 .. D-1 must all be there)

    def validate(self) -> None:
        super().validate()
        if self.days < 0 or self.days == 1:
            raise ConfigError(f"config key 'data.days': 0 (all) or >= 2 (train days + one eval day), got {self.days}")


@dataclass
class DLRMModelConfig:
    cardinalities: tuple[int, ...] = CARDINALITIES  # rows per table; the data's ids must be below them
    embedding_dim: int = 128
    bottom_mlp: tuple[int, ...] = (512, 256, 128)
    top_mlp: tuple[int, ...] = (1024, 1024, 512, 256, 1)
    dcn_layers: int = 3
    dcn_low_rank: int = 512
    # tables with at least this many rows live on one rank of the instance (model parallel, all-to-all);
    # smaller ones are replicated and trained data parallel with the MLPs
    shard_min_rows: int = 100_000
    # the tables this rank owns (those of >= shard_min_rows rows; on one rank: all of them) get sparse
    # gradients, live outside the flat buffer and are updated row-wise (a dense gradient of a 40M x 128
    # table is 20 GB); false: dense gradients in the flat buffer (equal in value, slower, bigger)
    sparse_grads: bool = True

    def validate(self) -> None:
        if len(self.cardinalities) != NUM_SPARSE or min(self.cardinalities) < 1:
            raise ConfigError(f"config key 'model.cardinalities': expected {NUM_SPARSE} table sizes >= 1, got "
                              f"{len(self.cardinalities)}")
        if not self.bottom_mlp or self.bottom_mlp[-1] != self.embedding_dim:
            raise ConfigError(f"config key 'model.bottom_mlp': must end at model.embedding_dim "
                              f"{self.embedding_dim}, got {list(self.bottom_mlp)}")
        if not self.top_mlp or self.top_mlp[-1] != 1:
            raise ConfigError(f"config key 'model.top_mlp': must end with 1 (one logit), got {list(self.top_mlp)}")
        if self.shard_min_rows < 1:
            raise ConfigError(f"config key 'model.shard_min_rows': must be >= 1, got {self.shard_min_rows}")


@dataclass
class DLRMConfig(RunConfig):
    data: DLRMDataConfig = field(default_factory=DLRMDataConfig)
    model: DLRMModelConfig = field(default_factory=DLRMModelConfig)

    def validate(self) -> None:
        t = self.train
        self.require_closed([
            ("train.eval_every", t.eval_every, 0.05, "the rules: 20 evaluations per epoch, every 0.05 epoch"),
            ("train.eval_every_samples", t.eval_every_samples, 0, "the cadence is train.eval_every's")])
        o = self.optim  # the optimizer: the record's (BENCHMARK.keys, adagrad)
        if o.schedule != "constant":
            raise ConfigError(f"config key 'optim.schedule': dlrm_dcnv2 logs warmup and decay in steps and the "
                              f"harness offers no polynomial decay; use 'constant' (with optional warmup), got {o.schedule!r}")
