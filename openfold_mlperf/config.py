"""OpenFold config: the shared run sections plus ``data`` (the reference's data and sampling settings) and
``model`` (the closed model or a shrunk one, and the initial checkpoint)."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date
from typing import Literal

from hpcbench.common.errors import ConfigError
from hpcbench.common.runconfig import DataConfig, RunConfig

from . import INIT_CHECKPOINT_SHA256

#: the reference's initial-training loaders (closed_openfold.yaml allows either): its PT loader draws in a
#: deterministic order, as ours does; its PQ loader hands samples on as workers finish them (a non-blocking
#: priority queue), an order this harness does not reproduce, so it is not offered
DATALOADER_TYPES = ("InitialTrainingDataloaderPT",)
#: training iterations between evaluations in a closed run (closed_openfold.yaml: val_every_iters == 40)
CLOSED_VAL_EVERY_ITERS = 40


@dataclass
class OpenFoldDataConfig(DataConfig):
    """``root`` holds the reference's processed layout (``pdb_mmcif/processed``, ``open_protein_set/processed``)."""

    crop_size: int = 256  # residues per training sample
    max_msa_clusters: int = 124
    max_extra_msa: int = 1024
    max_templates: int = 4
    num_recycling_iters: int = 3
    train_max_pdb_release_date: str = "2021-09-16"
    val_min_cameo_submission_date: str = "2021-09-17"
    val_max_cameo_submission_date: str = "2021-12-11"
    val_max_sequence_length: int = 700
    trust_pickle: bool = False  # read the reference's pickled dicts/<xy> (unpickling runs code from the file)
    # the reference's data loader, logged as initial_training_dataloader_type: ours samples as its
    # InitialTrainingDataloaderPT does (the only value offered, see DATALOADER_TYPES)
    loader_type: str = "InitialTrainingDataloaderPT"
    # every training step runs a number of recycling iterations drawn from 0..num_recycling_iters, as the
    # reference's loader draws them (spec.RecyclingDraws); false: always num_recycling_iters (open division)
    random_recycling: bool = True

    def validate(self) -> None:
        super().validate()
        for key in ("crop_size", "max_msa_clusters", "max_extra_msa", "max_templates", "val_max_sequence_length"):
            if getattr(self, key) < 1:
                raise ConfigError(f"config key 'data.{key}': must be >= 1, got {getattr(self, key)}")
        if self.num_recycling_iters < 0:
            raise ConfigError(f"config key 'data.num_recycling_iters': must be >= 0, got {self.num_recycling_iters}")
        for key in ("train_max_pdb_release_date", "val_min_cameo_submission_date", "val_max_cameo_submission_date"):
            try:
                date.fromisoformat(getattr(self, key))
            except ValueError:
                raise ConfigError(f"config key 'data.{key}': {getattr(self, key)!r} is not a YYYY-MM-DD date") from None
        if self.cache != "none":
            raise ConfigError(f"config key 'data.cache': every openfold epoch draws new chains, crops and MSA samples "
                              f"while reading, so neither samples nor batches can be kept; use 'none', got "
                              f"{self.cache!r}")
        if self.loader_type not in DATALOADER_TYPES:
            raise ConfigError(f"config key 'data.loader_type': {self.loader_type!r}; expected one of {DATALOADER_TYPES} "
                              "(the reference's PQ loader orders samples as its workers finish them, which this "
                              "harness does not reproduce)")


@dataclass
class OpenFoldModelConfig:
    # "closed": the reference's initial-training model (93,229,082 parameters); "mini": ModelConfig.mini with
    # the sizes below
    preset: Literal["closed", "mini"] = "closed"
    c_m: int = 32
    c_z: int = 16
    c_s: int = 32
    evoformer_blocks: int = 2
    extra_blocks: int = 1
    structure_blocks: int = 2
    chunk_size: int = 0  # > 0: chunked attention / outer product mean (memory), 0: unchunked
    # training recomputes each block's activations in the backward pass (the reference's memory saving); false
    # keeps them (the mini: ~30% faster steps on a CPU, its activations are a few MB)
    activation_checkpointing: bool = True
    # false: every dropout rate 0 (the reference's are 0.15 MSA / 0.25 pair / 0.1 structure module: too much
    # noise for a model of a few channels, which then does not learn a structure in minutes)
    dropout: bool = True
    # also start Adam from the checkpoint's moments and step, when it holds them (the reference's resumable
    # checkpoint does, and its train.py loads them)
    init_optimizer_state: bool = True
    # the reference's checkpoint format (model/checkpoint.py); "" = the seeded random initialisation. A relative
    # path is taken under data.root
    init_checkpoint: str = ""
    # the file's sha256, checked before it is loaded (a closed run: the reference's pinned checkpoint)
    init_checkpoint_sha256: str = ""

    def validate(self) -> None:
        for key in ("c_m", "c_z", "c_s", "evoformer_blocks", "extra_blocks", "structure_blocks"):
            if getattr(self, key) < 1:
                raise ConfigError(f"config key 'model.{key}': must be >= 1, got {getattr(self, key)}")
        if self.chunk_size < 0:
            raise ConfigError(f"config key 'model.chunk_size': must be >= 0 (0: unchunked), got {self.chunk_size}")
        if self.init_checkpoint_sha256 and (len(self.init_checkpoint_sha256) != 64
                                            or any(c not in "0123456789abcdef" for c in self.init_checkpoint_sha256)):
            raise ConfigError(f"config key 'model.init_checkpoint_sha256': {self.init_checkpoint_sha256!r} is not a "
                              "lower-case hex sha256")


@dataclass
class OpenFoldConfig(RunConfig):
    data: OpenFoldDataConfig = field(default_factory=OpenFoldDataConfig)
    model: OpenFoldModelConfig = field(default_factory=OpenFoldModelConfig)

    def validate(self) -> None:
        t, m = self.train, self.model
        if t.eval_every_samples % t.global_batch_size or (t.division == "closed" and t.eval_every_samples <= 0):
            raise ConfigError(f"config key 'train.eval_every_samples': OpenFold evaluates every N training iterations "
                              f"(val_every_iters); give N x train.global_batch_size ({t.global_batch_size}), got "
                              f"{t.eval_every_samples} (0, the epoch cadence of train.eval_every, is open-division only)")
        closed_cadence = CLOSED_VAL_EVERY_ITERS * t.global_batch_size
        self.require_closed([
            ("train.eval_every_samples", t.eval_every_samples, closed_cadence,
             f"every {CLOSED_VAL_EVERY_ITERS} iterations (closed_openfold.yaml: val_every_iters) x "
             f"train.global_batch_size {t.global_batch_size}"),
            ("optim.warmup_style", self.optim.warmup_style, "linspace",
             "the reference's OpenFoldBenchmarkLRScheduler, linspace(optim.warmup_start_lr, optim.lr, warmup)"),
            ("data.random_recycling", self.data.random_recycling, True,
             "each step's recycling iterations are drawn, as the reference's loader does"),
            ("model.init_optimizer_state", m.init_optimizer_state, True,
             "Adam starts from the initial checkpoint's moments and step, as the reference's train.py loads them"),
            ("model.dropout", m.dropout, True, "the reference's dropout rates"),
            ("model.preset", m.preset, "closed", "the reference's initial-training model"),
            ("model.init_checkpoint", m.init_checkpoint, bool, "a path to the reference's initial checkpoint"),
            ("model.init_checkpoint_sha256", m.init_checkpoint_sha256, INIT_CHECKPOINT_SHA256,
             "the reference's initial checkpoint"),
        ])
