"""BERT-large config: the shared run sections plus ``data`` and ``model`` (sizes default to BERT-large's)."""
from __future__ import annotations

from dataclasses import dataclass, field

from hpcbench.common.errors import ConfigError
from hpcbench.common.runconfig import DataConfig, RunConfig

from .facts import MAX_PRED, MAX_SEQ_LEN, VOCAB_SIZE


@dataclass
class BertDataConfig(DataConfig):
    """``root`` holds ``train/`` (HDF5 shards, packed or padded) and ``eval/`` (padded shards: the
    fixed evaluation samples, as the reference's ``create_eval_dataset`` writes them)."""

    max_seq_len: int = MAX_SEQ_LEN  # the batch's row length; every row of the data must fit
    max_pred: int = MAX_PRED  # predictions per sequence the reader accepts
    eval_samples: int = 0  # the first N samples of eval/ (the reference: 10,000); 0: all of them

    def validate(self) -> None:
        super().validate()
        if self.max_seq_len < 6 or self.max_pred < 1 or self.eval_samples < 0:
            raise ConfigError(f"config keys 'data.max_seq_len' >= 6, 'data.max_pred' >= 1, 'data.eval_samples' >= 0; "
                              f"got {self.max_seq_len}, {self.max_pred}, {self.eval_samples}")


@dataclass
class BertModelConfig:
    vocab_size: int = VOCAB_SIZE  # the data's ids must be below it (padded to a multiple of 8 in the model)
    hidden: int = 1024
    layers: int = 24
    heads: int = 16
    intermediate: int = 4096
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1

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
        if self.data.max_seq_len > MAX_SEQ_LEN:
            raise ConfigError(f"config key 'data.max_seq_len': at most {MAX_SEQ_LEN} (the model's positions), "
                              f"got {self.data.max_seq_len}")
