"""BERT-large config: the shared run sections plus ``data`` and ``model`` (sizes default to BERT-large's)."""
from __future__ import annotations

from dataclasses import dataclass, field

from hpcbench.common.errors import ConfigError
from hpcbench.common.runconfig import DataConfig, RunConfig

from .facts import MAX_PRED, MAX_SEQ_LEN, MAX_SEQ_PER_ROW, VOCAB_SIZE


@dataclass
class BertDataConfig(DataConfig):
    """``root`` holds ``train/`` (HDF5 shards, packed or padded) and ``eval/`` (padded shards: the
    fixed evaluation samples, as the reference's ``create_eval_dataset`` writes them)."""

    max_seq_len: int = MAX_SEQ_LEN  # the batch's row length; every row of the data must fit
    max_pred: int = MAX_PRED  # predictions per sequence the reader accepts
    eval_samples: int = 0  # the first N samples of eval/ (the reference: 10,000); 0: all of them
    # sequences per training row that train.global_batch_size (in sequences, as the rules count it) is
    # divided by to give the rows per step: NVIDIA's --average_packing_rate. 0: from the data (1 for padded
    # shards; the packed split's mean sequences per row, rounded: 2 for the reference's packed data)
    sequences_per_row: int = 0

    def validate(self) -> None:
        super().validate()
        if self.max_seq_len < 6 or self.max_pred < 1 or self.eval_samples < 0:
            raise ConfigError(f"config keys 'data.max_seq_len' >= 6, 'data.max_pred' >= 1, 'data.eval_samples' >= 0; "
                              f"got {self.max_seq_len}, {self.max_pred}, {self.eval_samples}")
        if not 0 <= self.sequences_per_row <= MAX_SEQ_PER_ROW:
            raise ConfigError(f"config key 'data.sequences_per_row': 0 (from the data) or 1..{MAX_SEQ_PER_ROW}, got "
                              f"{self.sequences_per_row}")


@dataclass
class BertModelConfig:
    vocab_size: int = VOCAB_SIZE  # the data's ids must be below it (padded to a multiple of 8 in the model)
    hidden: int = 1024
    layers: int = 24
    heads: int = 16
    intermediate: int = 4096
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    # the phase-1 checkpoint training starts from (the reference's TF model.ckpt-28252): a PyTorch state dict
    # (.pt/.pth/.bin; NVIDIA's names, `bert.encoder.layer.N...`) or a TF v1 checkpoint (the prefix, or its
    # .index file); "": random initialisation (refused in the closed division). checkpoint_load.py
    init_checkpoint: str = ""

    def validate(self) -> None:
        if min(self.vocab_size, self.hidden, self.layers, self.heads, self.intermediate) < 1:
            raise ConfigError("config keys 'model.vocab_size', 'model.hidden', 'model.layers', 'model.heads', "
                              "'model.intermediate' must be >= 1")
        if self.hidden % self.heads:
            raise ConfigError(f"config key 'model.hidden': {self.hidden} is not a multiple of model.heads {self.heads}")
        if not (0 <= self.hidden_dropout < 1 and 0 <= self.attention_dropout < 1):
            raise ConfigError("config keys 'model.hidden_dropout', 'model.attention_dropout' must be in [0, 1)")


@dataclass
class BertConfig(RunConfig):
    data: BertDataConfig = field(default_factory=BertDataConfig)
    model: BertModelConfig = field(default_factory=BertModelConfig)

    def validate(self) -> None:
        o = self.optim  # the optimizer: the record's (BENCHMARK.keys, lamb)
        if o.schedule not in ("poly", "constant"):
            raise ConfigError(f"config key 'optim.schedule': bert logs a polynomial decay with warmup; use 'poly' "
                              f"(or 'constant'), got {o.schedule!r}")
        t, m = self.train, self.model
        self.require_closed([
            # the reference's create_optimizer: lr (step - start_warmup_step) / num_warmup_steps from rate 0 while
            # step - start_warmup_step < num_warmup_steps, then the polynomial decay of the global step
            ("optim.warmup_style", o.warmup_style, "zero_start", "the reference's warmup and start_warmup_step"),
            # not in the rules' table, so the reference's: polynomial_decay to end_learning_rate 0 with poly_power 1
            ("optim.schedule", o.schedule, "poly", "the reference's polynomial decay"),
            ("optim.poly_from_warmup", o.poly_from_warmup, False, "the reference decays over the global step"),
            ("optim.power", o.power, 1.0, "the reference's poly_power"),
            ("optim.min_lr", o.min_lr, 0.0, "the reference's end_learning_rate"),
            ("optim.max_grad_norm", o.max_grad_norm, 1.0,
             "the reference's clip_by_global_norm(grads, clip_norm=1.0) before LAMB"),
            ("model.hidden_dropout", m.hidden_dropout, 0.1, "the reference's hidden_dropout_prob"),
            ("model.attention_dropout", m.attention_dropout, 0.1, "the reference's attention_probs_dropout_prob"),
            ("data.eval_samples", self.data.eval_samples, 10000, "the reference's eval_10k")])
        if t.division == "closed" and t.eval_every_samples != eval_interval(t.global_batch_size):
            raise ConfigError(f"config key 'train.eval_every_samples': the closed division evaluates every "
                              f"FLOOR(0.05 x (230.23 x global_batch_size + 3,000,000), 25,000) = "
                              f"{eval_interval(t.global_batch_size)} sequences at global batch {t.global_batch_size} "
                              f"(sequences), got {t.eval_every_samples}")
        if self.data.max_seq_len > MAX_SEQ_LEN:
            raise ConfigError(f"config key 'data.max_seq_len': at most {MAX_SEQ_LEN} (the model's positions), "
                              f"got {self.data.max_seq_len}")


def eval_interval(global_batch_size: int) -> int:
    """The rules' evaluation interval in training sequences (training_rules.adoc, BERT):
    FLOOR(0.05 x (230.23 x GBS + 3,000,000), 25,000), GBS in sequences."""
    return int(0.05 * (230.23 * global_batch_size + 3_000_000) // 25_000) * 25_000
