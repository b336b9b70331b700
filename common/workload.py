"""The contract between a workload and the harness (AlgoPerf-style).

A workload says *what* to train: its data (reader, synthetic generator, sample counts), its model,
loss, evaluation statistics, quality target and the MLPerf hyperparameter keys of its benchmark.
The harness (``hpcbench.common.trainer``) owns *how*: the loop, timing, evaluation cadence, MLPerf logging,
mixed precision, graph capture, checkpoints and the distributed setup. A workload never times
itself and never writes MLLOG lines.
"""
from __future__ import annotations

import importlib.resources
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

from .benchmark import Benchmark
from .config import load_config
from .data.datagen import Datagen
from .errors import ConfigError
from .runconfig import RunConfig

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from torch import nn

    from .data.spec import DatasetSpec, SampleSource
    from .parallel import Collectives, Degrees, Parallel

C = TypeVar("C", bound=RunConfig)


class EpochLoader(Protocol):
    """An iterable of batches for one rank that can be re-seeded per epoch."""

    def set_epoch(self, epoch: int) -> None: ...

    def __iter__(self) -> Iterator[Any]: ...

    def __len__(self) -> int: ...  # batches per epoch on this rank


@dataclass(frozen=True)
class DataShard:
    """Which part of the data one rank reads: its data-parallel rank and the per-rank batch."""

    rank: int
    size: int
    seed: int
    local_batch_size: int
    device: "torch.device"
    host_ranks: int = 1  # ranks on this physical host: they share its memory (data.cache = "host")


@dataclass(frozen=True)
class DataSizes:
    """What the harness learnt about the instance's data (set on the workload before
    :meth:`Workload.hyperparameters` is called)."""

    train_samples: int
    eval_samples: int
    steps_per_epoch: int
    local_batch_size: int = 0  # samples per data-parallel rank per step (0: not known, e.g. in a unit test)


@dataclass(frozen=True)
class QualityTarget:
    metric_key: str  # the MLPerf key: eval_error or eval_accuracy
    higher_is_better: bool
    threshold: float

    def reached(self, value: float) -> bool:
        return value >= self.threshold if self.higher_is_better else value <= self.threshold

    def describe(self) -> str:
        return f"{self.metric_key} {'>=' if self.higher_is_better else '<='} {self.threshold:g}"


class Workload(Datagen, ABC, Generic[C]):
    """One benchmark. Subclasses set ``record`` and ``config_cls`` and implement the abstract methods."""

    # the benchmark's record (:mod:`hpcbench.common.benchmark`), declared once in the workload's package;
    # ``name``, ``benchmark``, ``suite``, ``ruleset``, ``metric_key`` and ``higher_is_better`` repeat its
    # fields on the class (set from it by ``__init_subclass__``, never declared)
    record: ClassVar[Benchmark]
    name: ClassVar[str]
    benchmark: ClassVar[str]
    suite: ClassVar[str]
    ruleset: ClassVar[str]
    metric_key: ClassVar[str]
    higher_is_better: ClassVar[bool]
    config_cls: ClassVar[type[RunConfig]]
    static_shapes: ClassVar[bool] = True  # False: no CUDA graph capture (e.g. variable-size graphs)
    eval_needs_grad: ClassVar[bool] = False  # True: eval runs with autograd on (e.g. forces = -dE/dx)
    # "sums": additive statistics per batch (eval_sums/metric); "samples": the metric needs every
    # sample's outputs (eval_samples/metric_of_samples, e.g. exact AUROC)
    eval_kind: ClassVar[str] = "sums"
    # True: ``distribute`` returns a model that shards its own parameters (FSDP2 / tensor-parallel DTensors):
    # the harness then trains it with :mod:`hpcbench.common.sharded` (no flat buffer, no broadcast, AdamW on the
    # local shards, checkpoints through torch.distributed.checkpoint)
    shards_parameters: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        r = cls.__dict__.get("record")
        if r is not None:
            cls.name, cls.benchmark, cls.suite, cls.ruleset = r.name, r.benchmark, r.suite, r.ruleset
            cls.metric_key, cls.higher_is_better = r.metric_key, r.higher_is_better

    def __init__(self, cfg: C) -> None:
        self.record.check_optimizer(cfg.optim.name)
        self.cfg = cfg
        self.sizes: DataSizes | None = None  # set by the harness once the loaders exist
        self._sources: dict[str, "SampleSource"] = {}

    # configuration ------------------------------------------------------------------------
    @classmethod
    def presets_dir(cls) -> Path:
        package = cls.__module__.rpartition(".")[0] or cls.__module__  # the workload's own package
        return Path(str(importlib.resources.files(package))) / "configs"

    @classmethod
    def load_config(cls, source: str | Path | None = None, overrides: Sequence[str] = ()) -> C:
        """The preset or file ``source`` with ``overrides``, checked against the record: the optimizer is
        one its MLPerf keys describe, and ``train.target`` is the record's closed target in the closed
        division (left out of a preset) or, in the open division, the preset's own (default: the closed one)."""
        cfg = load_config(cls.config_cls, source, overrides, presets_dir=cls.presets_dir())
        cls.record.check_optimizer(cfg.optim.name)  # type: ignore[attr-defined]
        t = cfg.train  # type: ignore[attr-defined]
        t.target = cls.record.resolve_target(t.target, t.division)
        return cfg  # type: ignore[return-value]

    def target(self) -> QualityTarget:
        t = self.cfg.train
        return QualityTarget(self.metric_key, self.higher_is_better, self.record.resolve_target(t.target, t.division))

    # data ---------------------------------------------------------------------------------
    def dataset(self) -> "DatasetSpec":
        """The workload's dataset spec, built from its config (see :mod:`hpcbench.common.data.spec`)."""
        from .errors import HpcbenchError

        raise HpcbenchError(f"workload '{self.name}' declares no dataset spec")

    def data_root(self) -> Path:
        root = getattr(getattr(self.cfg, "data", None), "root", "")
        if not root:
            raise ConfigError(f"config key 'data.root' is empty; pass --data DIR (write a dataset with "
                              f"`hpcbench datagen {self.name} --out DIR`)")
        return Path(root)

    def source(self, split: str) -> "SampleSource":
        """The validated samples of ``split`` under the data root (opened once)."""
        if split not in self._sources:
            self._sources[split] = self.dataset().open(self.data_root(), split)
        return self._sources[split]

    def start_data(self) -> None:
        """The timed part of opening the data (:meth:`DatasetSpec.start` of every split opened so far); the
        harness calls it after ``run_start`` (a workload without a dataset spec has nothing to start)."""
        from .errors import HpcbenchError

        if not self._sources:
            return
        try:
            spec = self.dataset()
        except HpcbenchError:
            return
        for source in self._sources.values():
            spec.start(source)

    def dataset_sizes(self) -> tuple[int, int]:
        """(train samples, eval samples) under this rank's data root."""
        spec = self.dataset()
        return len(self.source(spec.train_split)), len(self.source(spec.eval_split))

    def train_loader(self, shard: DataShard) -> EpochLoader:
        """This rank's training batches, shuffled per epoch from ``shard.seed`` (or in the stored order where
        the dataset spec's ``order`` is ``"stored"``)."""
        return self._loader(self.dataset().train_split, shard, train=True)

    def eval_loader(self, shard: DataShard) -> EpochLoader:
        """This rank's disjoint part of the validation set (every sample seen once in total)."""
        return self._loader(self.dataset().eval_split, shard, train=False)

    def _loader(self, split: str, shard: DataShard, train: bool) -> EpochLoader:
        from .data.dali import DaliLoader
        from .data.loader import Loader, reader_threads
        from .data.sampler import EpochSampler, StoredOrderSampler

        spec, source = self.dataset(), self.source(split)
        shuffle = getattr(self.cfg.data, "shuffle", "global")  # type: ignore[attr-defined]
        sampler: EpochSampler | StoredOrderSampler
        if spec.order == "stored":
            if train and getattr(self.cfg.data, "last_batch", "drop") != "drop":  # type: ignore[attr-defined]
                raise ConfigError(f"config key 'data.last_batch': workload '{self.name}' reads its training split "
                                  "in the stored order (its own sample index), which 'pad' does not apply to; use "
                                  "'drop'")
            sampler = StoredOrderSampler(len(source), shard.local_batch_size, shard.rank, shard.size, train=train,
                                         where=str(self.data_root() / split), shuffle=shuffle)
        else:
            costs = source.costs() if spec.partition == "balanced" else None
            sampler = EpochSampler(len(source), shard.local_batch_size, shard.rank, shard.size, shard.seed,
                                   spec.partition, train=train, costs=costs, shuffle=shuffle,
                                   where=str(self.data_root() / split),
                                   last_batch=getattr(self.cfg.data, "last_batch", "drop"))  # type: ignore[attr-defined]
        d = self.cfg.data  # type: ignore[attr-defined]
        kwargs = dict(threads=reader_threads(d.threads, shard.device), prefetch=d.prefetch,
                      cache=getattr(d, "cache", "none"), host_ranks=shard.host_ranks)
        if self.cfg.train.loader == "dali":
            return DaliLoader(spec, source, sampler, shard.device,
                              batch_multiplier=getattr(d, "dali_batch_multiplier", 1), **kwargs)
        return Loader(spec, source, sampler, shard.device, **kwargs)

    # model and maths ----------------------------------------------------------------------
    @abstractmethod
    def build_model(self) -> "nn.Module":
        """Single-device model in fp32; the harness moves it, wraps it and sets precision. A workload that
        shards its parameters (``shards_parameters``) may return it on the meta device (no storage): the
        harness then leaves the move to :meth:`distribute`, which must give every parameter storage and its
        initial values (``to_empty`` + an init that draws from the state the harness seeded)."""

    @abstractmethod
    def forward(self, model: "nn.Module", batch: Any) -> Any:
        """Model outputs for a batch already on the device."""

    def on_device(self, device: "torch.device") -> None:
        """Called by the training step with its device before its first step, outside anything compiled or
        captured: make the constants :meth:`forward` and :meth:`loss` use on the device here. A cache filled
        inside the step instead (``if device not in cache``) changes between the first and second call, which
        fails ``torch.compile``'s guard and compiles the step again (DeepCAM: three compilations, over 3
        minutes on an H200)."""

    @abstractmethod
    def loss(self, outputs: Any, batch: Any) -> "torch.Tensor":
        """The training loss of this rank's batch as a *sum* over its terms (pixels, samples, force
        components); the harness divides by the instance-wide :meth:`loss_count`, so the gradient
        is that of the global mean whatever each rank holds. A workload that returns None from
        :meth:`loss_count` returns a per-rank mean here instead (averaged over ranks)."""

    def loss_count(self, batch: Any) -> "torch.Tensor | None":
        """How many terms :meth:`loss` sums over in this batch, as a device tensor (the harness
        sums it over the instance while the forward pass runs). None: ``loss`` is already a mean.
        Ranks that share samples (spatial parallelism, :meth:`parallel_degrees`) each count them: their gradients are
        summed, so a loss they each hold in full and differentiate as one program adds up to S copies."""
        return None

    @abstractmethod
    def eval_sums(self, outputs: Any, batch: Any) -> Mapping[str, "torch.Tensor"]:
        """Additive statistics of one eval batch (e.g. sum of errors and count). The harness sums
        them over batches and over the instance's ranks, then calls :meth:`metric`."""

    @abstractmethod
    def metric(self, sums: Mapping[str, float]) -> float:
        """The quality metric from the summed statistics."""

    def diverged(self, value: float) -> bool:
        """True when an evaluation's metric says the model diverged and the run stops there, aborted, as the
        reference stops (default: never; the target or the run's length ends it)."""
        return False

    def eval_samples(self, outputs: Any, batch: Any) -> Mapping[str, "torch.Tensor"]:
        """With ``eval_kind = "samples"``: per-sample tensors of one eval batch (first dimension = the
        batch's samples); the harness concatenates them over the rank's batches."""
        raise NotImplementedError(f"workload '{self.name}' sets eval_kind='samples' but has no eval_samples()")

    def metric_of_samples(self, kept: Mapping[str, "torch.Tensor"], parallel: "Collectives") -> float:
        """With ``eval_kind = "samples"``: the metric over every rank's samples; each rank calls it with its
        own ``kept`` and combines them with the layout object's collective services (``parallel.size``,
        ``parallel.sum``, ``parallel.gather``), never with torch.distributed itself."""
        raise NotImplementedError(f"workload '{self.name}' sets eval_kind='samples' but has no metric_of_samples()")

    # model parallelism ----------------------------------------------------------------------
    def parallel_degrees(self) -> "Degrees":
        """What this workload asks of the instance's ranks beyond data parallelism (ranks that share each
        sample, parameters held per rank, tensor parallelism); the harness adds its own keys
        (``train.eval_ranks``, ``train.bn_group_size``) and builds the layout object
        (:class:`hpcbench.common.parallel.Parallel`) from them, once."""
        from .parallel import Degrees

        return Degrees()

    def distribute(self, model: "nn.Module", parallel: "Parallel") -> "nn.Module":
        """The model as this rank of the instance holds it (e.g. embedding tables sharded over the ranks,
        a spatial group's slab), on the groups of the layout object ``parallel``. Called on every rank after
        the same seeded build and the move to the device (for a model built on the meta device: no move,
        and this materialises it on ``parallel.device``)."""
        return model

    def local_parameters(self, model: "nn.Module") -> list["nn.Parameter"]:
        """Parameters that only this rank holds (model parallel): neither broadcast from rank 0 nor
        all-reduced; their gradients arrive complete through the model's own collectives."""
        return []

    def sparse_parameters(self, model: "nn.Module") -> list["nn.Parameter"]:
        """Parameters whose gradients arrive sparse (embedding tables with ``sparse=True``): kept out of the
        flat buffer and updated row-wise by Adagrad. With several ranks they must be local ones."""
        return []

    def initial_optimizer_state(self, names: Sequence[str]) -> dict[str, Any] | None:
        """Optimizer state a run starts from, e.g. the moments a pretrained checkpoint carries (the MLPerf HPC
        OpenFold reference's resumable checkpoint): ``{"step": steps taken, <state>: [one tensor per parameter
        named in ``names``, in that order]}`` with the optimizer's state names (Adam: ``exp_avg``,
        ``exp_avg_sq``, as torch's); None (the default): the optimizer starts fresh. Called after
        :meth:`build_model`; a resumed run's checkpoint replaces it."""
        return None

    def no_weight_decay(self, name: str) -> bool:
        """True for a parameter (by its name in the model) that the benchmark's optimizer keeps out of
        the weight decay (BERT: biases and LayerNorm weights; ResNet: BatchNorm parameters and biases,
        which LARS also leaves out of its trust ratio); LAMB, LARS and SGD take such a mask."""
        return False

    def hyperparameters(self) -> dict[str, Any]:
        """The benchmark's MLPerf hyperparameter keys with values: the optimizer and schedule keys its record
        names and the shared data keys (built by :mod:`hpcbench.common.mlperf_keys`); a workload adds the keys only it logs
        (``{**super().hyperparameters(), "dropout": ...}``). ``self.sizes`` is set when the harness calls this."""
        from .mlperf_keys import data_keys, optimizer_keys

        steps = self.sizes.steps_per_epoch if self.sizes is not None else 0
        return {**optimizer_keys(self.record, self.cfg.optim, steps, self.cfg.train.max_epochs),
                **data_keys(self.max_sequence_length())}

    def max_sequence_length(self) -> int | None:
        """Tokens per sample for a language model (logged as ``max_sequence_length`` by
        :meth:`hyperparameters`, :func:`hpcbench.common.mlperf_keys.data_keys`); None: not a sequence model."""
        return None

    def loader_batch_size(self) -> int:
        """Rows the instance's loaders deliver per step (split over the data-parallel ranks). Default
        ``train.global_batch_size``; a workload whose rows hold several of the rules' samples (packed BERT:
        up to 3 sequences per row, the global batch counted in sequences) returns fewer rows."""
        return self.cfg.train.global_batch_size

    def counts_samples_per_step(self) -> bool:
        """True where a step's number of the rules' samples varies (packed BERT: sequences per batch of
        rows): the harness then sums :meth:`batch_size` over the instance at every step and counts the
        evaluation cadence, ``epoch_num`` and throughput in those samples (one host integer reduced per
        step); False: samples = steps x global batch."""
        return False

    def batch_size(self, batch: Any) -> int:
        """Number of the rules' samples in a batch (throughput; with :meth:`counts_samples_per_step` also the
        cadence and ``epoch_num``). Read from the host side of the batch: no device synchronisation."""
        if isinstance(batch, Mapping):
            batch = next(iter(batch.values()))
        if isinstance(batch, (tuple, list)):
            batch = batch[0]
        return int(batch.shape[0])
