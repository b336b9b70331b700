"""Llama 3.1 8B config: the shared run sections plus ``data`` and ``model`` (sizes default to the MLPerf model's)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from hpcbench.common.errors import ConfigError
from hpcbench.common.runconfig import DataConfig, RunConfig


#: a closed run evaluates every this many training sequences (training_rules.adoc; the reference's --eval_every)
CLOSED_EVAL_EVERY_SAMPLES = 12288
CLOSED_EVAL_SAMPLES = 1024


def reference_eval_index_samples(max_steps: int, global_batch: int, eval_every: int = CLOSED_EVAL_EVERY_SAMPLES,
                                 eval_samples: int = CLOSED_EVAL_SAMPLES) -> int:
    """The validation index size the reference's code builds (NeMo 2.1.0 ``PreTrainingDataModule``:
    ``(max_steps // val_check_interval + 1) x limit_val_batches x global batch``), with pretrain_llama31.py's
    ``val_check_interval = ceil(eval_every / gbs) / gbs`` (the steps divided by the batch once more: 48.0 at batch
    16) and ``limit_val_batches = ceil(eval_samples / gbs)``: 25,601,024 at batch 16."""
    interval = math.ceil(eval_every / global_batch) / global_batch
    return int((max_steps // interval + 1) * math.ceil(eval_samples / global_batch) * global_batch)


@dataclass
class LlamaDataConfig(DataConfig):
    """``root`` holds ``train/`` and ``validation/`` folders of indexed datasets (PREFIX.bin + PREFIX.idx)."""

    seq_len: int = 8192  # tokens per sample's input (samples hold seq_len + 1); the closed max_sequence_length
    train_samples: int = 0  # samples the training index is built for (Megatron: steps x batch); 0: one pass
    eval_samples: int = 1024  # the first N samples of the validation set (the closed rules: 1024)
    # "reference": the validation GPTDataset as the reference's code builds it (seeded with the run's seed, an index
    # of eval_index_samples), its first eval_samples; "document": the first eval_samples in document order,
    # unshuffled (the reference's README)
    eval_order: str = "reference"
    eval_index_samples: int = 0  # samples the validation index is built for (NeMo's num_val_samples); 0: eval_samples
    # Megatron's weighted prefix list for train/: ["12.5", "c4-train.en_0_text_document", ...] (blend.py); empty:
    # every prefix of train/ in name order as one corpus
    train_blend: list[str] = field(default_factory=list)
    # where the index arrays are kept between ranks and runs (index_cache.py): "auto" = ROOT/.index_cache when it
    # can be written (else none), "none", or a writable folder (e.g. on shared storage, for node-local data)
    index_cache: str = "auto"

    def validate(self) -> None:
        super().validate()
        if len(self.train_blend) % 2:
            raise ConfigError(f"config key 'data.train_blend': expected pairs of weight and prefix, got "
                              f"{len(self.train_blend)} items")
        if self.eval_order not in ("reference", "document"):
            raise ConfigError(f"config key 'data.eval_order': expected 'reference' or 'document', got {self.eval_order!r}")
        if self.eval_index_samples < 0:
            raise ConfigError(f"config key 'data.eval_index_samples': expected >= 0 (0: data.eval_samples), "
                              f"got {self.eval_index_samples}")
        if self.seq_len < 1 or self.train_samples < 0 or self.eval_samples < 1:
            raise ConfigError(f"config keys 'data.seq_len' >= 1, 'data.train_samples' >= 0, 'data.eval_samples' >= 1; "
                              f"got {self.seq_len}, {self.train_samples}, {self.eval_samples}")


@dataclass
class LlamaModelConfig:
    vocab_size: int = 128256
    dim: int = 4096
    layers: int = 32
    heads: int = 32
    kv_heads: int = 8
    ffn_dim: int = 14336
    rope_theta: float = 500000.0
    tensor_parallel: int = 1  # ranks that split each layer (torch.distributed.tensor.parallel)
    activation_checkpointing: bool = False  # recompute each block's activations in the backward pass
    max_steps: int = 1200000  # the schedule's length the closed rules fix (logged as max_steps)

    def validate(self) -> None:
        if min(self.vocab_size, self.dim, self.layers, self.heads, self.kv_heads, self.ffn_dim, self.tensor_parallel) < 1:
            raise ConfigError("config keys 'model.*' sizes must be >= 1")
        if self.dim % self.heads or self.heads % self.kv_heads or (self.dim // self.heads) % 2:
            raise ConfigError(f"config keys 'model.dim' ({self.dim}), 'model.heads' ({self.heads}), 'model.kv_heads' "
                              f"({self.kv_heads}): heads must divide dim into an even head size, kv_heads divide heads")


@dataclass
class LlamaConfig(RunConfig):
    data: LlamaDataConfig = field(default_factory=LlamaDataConfig)
    model: LlamaModelConfig = field(default_factory=LlamaModelConfig)

    def validate(self) -> None:
        o = self.optim
        if o.name != "adamw" or o.schedule != "cosine" or o.unit != "steps":
            raise ConfigError(f"config keys 'optim.name', 'optim.schedule', 'optim.unit': llama31_8b trains with adamw "
                              f"and a cosine schedule with linear warmup in steps; got {o.name!r}, {o.schedule!r}, "
                              f"{o.unit!r}")
        self._validate_closed()

    def _validate_closed(self) -> None:
        """The rows of training_rules.adoc (llama31_8b) and the reference (pretrain_llama31.py) that the official
        checker does not test, refused before a closed run starts (every row that fails, named with its key, its
        value and what a closed run requires)."""
        o, t, m, d = self.optim, self.train, self.model, self.data
        end_lr, samples = 0.1 * o.lr, m.max_steps * t.global_batch_size
        val_index = reference_eval_index_samples(m.max_steps, t.global_batch_size)
        self.require_closed([
            ("optim.min_lr", o.min_lr, lambda v: math.isclose(v, end_lr, rel_tol=1e-9),
             f"the cosine ends at opt_base_learning_rate x 0.1 (training_rules.adoc: opt_end_learning_rate; the "
             f"reference's min_lr = max_lr x 0.1), i.e. {end_lr:g} for optim.lr = {o.lr:g}"),
            ("optim.total", o.total, m.max_steps,
             f"the cosine decays over model.max_steps (opt_learning_rate_decay_steps = {m.max_steps} - warmup)"),
            ("optim.warmup_style", o.warmup_style, "nemo",
             "the reference's NeMo CosineAnnealing warmup, lr (step + 1) / (warmup + 1)"),
            ("train.eval_every_samples", t.eval_every_samples, CLOSED_EVAL_EVERY_SAMPLES,
             f"training_rules.adoc: every {CLOSED_EVAL_EVERY_SAMPLES} sequences, CEIL({CLOSED_EVAL_EVERY_SAMPLES} / "
             f"global batch) steps"),
            ("train.eval_start", t.eval_start, 0, "the reference's start_eval_at 0: from the first interval on"),
            ("train.eval_offset", t.eval_offset, 0, "the reference's start_eval_at 0: from the first interval on"),
            ("data.train_samples", d.train_samples, samples,
             f"the training index is built for model.max_steps x train.global_batch_size = {m.max_steps} x "
             f"{t.global_batch_size} = {samples} samples, the reference's num_train_samples (Megatron shuffles "
             f"that many)"),
            ("data.eval_order", d.eval_order, "reference",
             "the reference's code evaluates on the first 1024 samples of the validation GPTDataset shuffled with the "
             "run's seed (its README says unshuffled; the code is what ran: docs/closed.md)"),
            ("data.eval_index_samples", d.eval_index_samples, val_index,
             f"the reference's validation index, NeMo's num_val_samples for model.max_steps = {m.max_steps} at global "
             f"batch {t.global_batch_size}: {val_index} (its shuffle spans that many, so it fixes which 1024 are read)")])
