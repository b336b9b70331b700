"""BERT-large on the harness (training suite, ruleset training 5.0.0): data, model, loss, masked-LM accuracy,
MLPerf keys.

Why 5.0.0 and not 5.1.0: the installed mlperf-logging keeps ``closed_bert.yaml`` in training 5.1.0, but
that ruleset's ``closed_common.yaml``/``open_common.yaml`` no longer accept ``bert`` as a
``submission_benchmark`` (nor does ``benchmark_meta`` list it for 5.1), so a bert log fails the 5.1.0
checker on that key alone; 5.0.0 is the newest ruleset whose checker accepts it (its
``closed_bert.yaml`` is the same file).

The optimizer is LAMB on the flat buffer (``optim.distributed``: state sharded over the ranks) with
the reference's exemptions from weight decay (:meth:`no_weight_decay`: biases and LayerNorm
weights), gradient clipping at global norm 1 and the reference's polynomial decay (``poly``,
power 1, from step 0). The loss is the reference's: mean masked-LM cross entropy + mean
next-sentence cross entropy of the rank's batch (averaged over ranks). ``eval_accuracy`` is the
masked-LM accuracy over the whole eval set: (correct, count) summed over batches and ranks.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from hpcbench.common.errors import ConfigError
from hpcbench.common.workload import Workload

from . import BENCHMARK
from .config import BertConfig
from .dataset import BertData
from .synth import BertDatagen

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from torch import nn

    from .batch import Batch


class BertWorkload(BertDatagen, Workload[BertConfig]):
    record = BENCHMARK
    config_cls = BertConfig
    static_shapes: ClassVar[bool] = False  # packed batches hold a varying number of real tokens

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__(cfg)
        d = cfg.data
        self._spec = BertData(d.max_seq_len, d.max_pred, cfg.model.vocab_size, d.eval_samples,
                              exact_eval=cfg.train.division == "closed")

    def dataset(self) -> BertData:
        return self._spec

    # samples: sequences, as the rules count them ------------------------------------------------
    def sequences_per_row(self) -> int:
        """What the global batch (in sequences) is divided by to give rows per step: ``data.sequences_per_row``,
        or from the training split (1 when padded; its mean sequences per row, rounded, when packed; NVIDIA's
        ``--average_packing_rate``, 2 on the reference's packed data). A set value more than 10% off the
        data's mean is refused: the logged global batch would not describe the steps."""
        train = self.source(self._spec.train_split)
        rows, seqs = len(train), train.sequences()  # type: ignore[attr-defined]
        mean = seqs / rows
        asked = self.cfg.data.sequences_per_row
        if not asked:
            return max(1, round(mean))
        if abs(asked - mean) > 0.1 * mean:
            raise ConfigError(f"config key 'data.sequences_per_row': {asked}, but the training split "
                              f"{self.data_root() / self._spec.train_split} holds {seqs} sequences in {rows} rows "
                              f"({mean:.3f} per row); use 0 (from the data) or {max(1, round(mean))}")
        return asked

    def loader_batch_size(self) -> int:
        """Rows per step: ``train.global_batch_size`` (sequences, the rules' GBS) / :meth:`sequences_per_row`."""
        gbs, per = self.cfg.train.global_batch_size, self.sequences_per_row()
        if gbs % per:
            raise ConfigError(f"config key 'train.global_batch_size': {gbs} sequences is not a whole number of rows "
                              f"of {per} sequences (data.sequences_per_row; the training split is packed); use a "
                              f"multiple of {per}")
        return gbs // per

    def counts_samples_per_step(self) -> bool:
        """Packed training rows hold 1-3 sequences: the harness counts each step's sequences."""
        return bool(self.source(self._spec.train_split).packed)  # type: ignore[attr-defined]

    def batch_size(self, batch: "Batch") -> int:  # type: ignore[override]
        """Sequences in the batch (one next-sentence label each), the rules' samples."""
        return int(batch.nsp_labels.numel())

    def dataset_sizes(self) -> tuple[int, int]:
        """(training sequences, eval sequences): ``train_samples``/``eval_samples`` in the rules' samples."""
        train = self.source(self._spec.train_split)
        evaluate = self.source(self._spec.eval_split)
        return train.sequences(), evaluate.sequences()  # type: ignore[attr-defined]

    # model ----------------------------------------------------------------------------------
    def model_config(self) -> Any:
        from .model import ModelConfig

        m = self.cfg.model
        return ModelConfig(vocab_size=m.vocab_size, hidden=m.hidden, layers=m.layers, heads=m.heads,
                           intermediate=m.intermediate, max_position=self.cfg.data.max_seq_len,
                           hidden_dropout=m.hidden_dropout, attention_dropout=m.attention_dropout)

    def build_model(self) -> "nn.Module":
        """The model, from ``model.init_checkpoint`` (the phase-1 checkpoint; required in the closed division)."""
        from .checkpoint_load import load_init_checkpoint
        from .model import BertForPretraining

        path = self.cfg.model.init_checkpoint
        if not path and self.cfg.train.division == "closed":
            raise ConfigError("config key 'model.init_checkpoint': the closed division starts from the reference's "
                              "phase-1 checkpoint (TF model.ckpt-28252, or its PyTorch conversion model.ckpt-28252.pt); "
                              "set --set model.init_checkpoint=PATH, or use the open division")
        model = BertForPretraining(self.model_config())
        if path:
            load_init_checkpoint(model, path)
        return model

    def no_weight_decay(self, name: str) -> bool:
        from .model import no_weight_decay

        return no_weight_decay(name)

    def forward(self, model: "nn.Module", batch: "Batch") -> tuple["torch.Tensor", "torch.Tensor"]:
        return model(batch)

    def loss(self, outputs: tuple["torch.Tensor", "torch.Tensor"], batch: "Batch") -> "torch.Tensor":
        """The reference's loss, a per-rank mean (``loss_count`` None: the harness averages over ranks)."""
        from .model import pretraining_loss

        return pretraining_loss(outputs[0], outputs[1], batch)

    # evaluation -----------------------------------------------------------------------------
    def eval_sums(self, outputs: tuple["torch.Tensor", "torch.Tensor"], batch: "Batch") -> Mapping[str, "torch.Tensor"]:
        from .metric import mlm_accuracy_sums

        correct, count = mlm_accuracy_sums(outputs[0], batch.mlm_labels)
        return {"correct": correct, "count": count}

    def metric(self, sums: Mapping[str, float]) -> float:
        from .metric import eval_accuracy

        return eval_accuracy([sums["correct"], sums["count"]])  # type: ignore[arg-type]

    def max_sequence_length(self) -> int:
        """Logged as ``max_sequence_length`` with the record's keys (closed_bert.yaml of training 5.0.0/5.1.0)."""
        return self.cfg.data.max_seq_len

