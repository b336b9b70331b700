"""Loading the phase-1 checkpoint the reference starts from onto :class:`~.model.BertForPretraining`.

Two published forms of the same weights (the reference's TF ``model.ckpt-28252``, bert-large-uncased
after phase 1; ``language_model/tensorflow/bert`` README, "checkpoint"):

* **TF v1** (``model.ckpt-28252.index`` + ``.data-00000-of-00001``), read without TensorFlow by
  :mod:`.tf_bundle`; names ``bert/encoder/layer_N/attention/self/query/kernel`` etc., dense kernels stored
  (in, out), i.e. transposed against torch's (out, in); the next-sentence head's ``output_weights`` is
  stored (2, hidden) (the reference multiplies with ``transpose_b=True``). Optimizer slots (``.../adam_m``,
  ``.../adam_v``) and ``global_step`` are skipped.
* **PyTorch** (what submitters load: NVIDIA's ``convert_tf_checkpoint.py`` output, ``model.ckpt-28252.pt``):
  a state dict (bare, or under ``"model"``/``"state_dict"``, a ``module.`` prefix allowed) with the names of
  NVIDIA's/HF's ``BertForPreTraining``: ``bert.embeddings.word_embeddings.weight``,
  ``bert.encoder.layer.N.attention.self.query.weight``, ``cls.predictions.bias``, ... NVIDIA's
  ``LinearActivation`` layers are named ``dense_act`` (accepted for ``dense``), old LayerNorms
  ``gamma``/``beta`` (accepted for ``weight``/``bias``).

Onto our model: each stored tensor fills one parameter (query, key and value are three, as in the
reference); the decoder is tied to the word embeddings (a stored ``cls.predictions.decoder.weight`` must
equal them); the vocabulary (30522) fills the first rows of our padded one (30528; the padding rows and
their output bias are zeroed, as no input or label uses them); position embeddings beyond
``data.max_seq_len`` are dropped.
Every name the model needs must be there with its shape, and every name in the file must be used:
otherwise a :class:`~hpcbench.common.errors.DataError` names the file, the tensor and what was expected.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from hpcbench.common.errors import DataError


@dataclass(frozen=True)
class Entry:
    """One stored tensor: its PyTorch-form name, its TF name, the parameter of ours it fills and how."""

    torch: str
    tf: str
    ours: str
    tf_transposed: bool = False  # a TF dense kernel, stored (in, out)


def _dense(torch_prefix: str, tf_prefix: str, ours: str) -> list[Entry]:
    return [Entry(f"{torch_prefix}.weight", f"{tf_prefix}/kernel", f"{ours}.weight", True),
            Entry(f"{torch_prefix}.bias", f"{tf_prefix}/bias", f"{ours}.bias")]


def _norm(torch_prefix: str, tf_prefix: str, ours: str) -> list[Entry]:
    return [Entry(f"{torch_prefix}.weight", f"{tf_prefix}/gamma", f"{ours}.weight"),
            Entry(f"{torch_prefix}.bias", f"{tf_prefix}/beta", f"{ours}.bias")]


def entries(layers: int) -> list[Entry]:
    """Every tensor of the reference's BERT pretraining checkpoint for ``layers`` encoder layers."""
    out = [Entry("bert.embeddings.word_embeddings.weight", "bert/embeddings/word_embeddings", "embeddings.word.weight"),
           Entry("bert.embeddings.position_embeddings.weight", "bert/embeddings/position_embeddings",
                 "embeddings.position.weight"),
           Entry("bert.embeddings.token_type_embeddings.weight", "bert/embeddings/token_type_embeddings",
                 "embeddings.segment.weight"),
           *_norm("bert.embeddings.LayerNorm", "bert/embeddings/LayerNorm", "embeddings.norm")]
    for n in range(layers):
        t, f, o = f"bert.encoder.layer.{n}", f"bert/encoder/layer_{n}", f"layers.{n}"
        for name in ("query", "key", "value"):
            out += _dense(f"{t}.attention.self.{name}", f"{f}/attention/self/{name}", f"{o}.attention.{name}")
        out += _dense(f"{t}.attention.output.dense", f"{f}/attention/output/dense", f"{o}.attention.out")
        out += _norm(f"{t}.attention.output.LayerNorm", f"{f}/attention/output/LayerNorm", f"{o}.attention_norm")
        out += _dense(f"{t}.intermediate.dense", f"{f}/intermediate/dense", f"{o}.ffn_in")
        out += _dense(f"{t}.output.dense", f"{f}/output/dense", f"{o}.ffn_out")
        out += _norm(f"{t}.output.LayerNorm", f"{f}/output/LayerNorm", f"{o}.ffn_norm")
    out += _dense("bert.pooler.dense", "bert/pooler/dense", "pooler")
    out += _dense("cls.predictions.transform.dense", "cls/predictions/transform/dense", "mlm_transform")
    out += _norm("cls.predictions.transform.LayerNorm", "cls/predictions/transform/LayerNorm", "mlm_norm")
    out += [Entry("cls.predictions.bias", "cls/predictions/output_bias", "mlm_bias"),
            Entry("cls.seq_relationship.weight", "cls/seq_relationship/output_weights", "nsp.weight"),
            Entry("cls.seq_relationship.bias", "cls/seq_relationship/output_bias", "nsp.bias")]
    return out


#: names in a TF checkpoint that are not weights (LAMB/Adam slots, the step counter)
_TF_SKIP = re.compile(r"(^|/)(adam_m|adam_v|lamb_m|lamb_v|Momentum)$|^global_step$|^good_steps$|^loss_scale$")
#: the decoder weight tied to the word embeddings (a copy of them in the PyTorch form)
_TIED = "cls.predictions.decoder.weight"
_DECODER_BIAS = "cls.predictions.decoder.bias"  # HF's second reference to cls.predictions.bias


def is_tf_checkpoint(path: Path) -> bool:
    """A TF v1 checkpoint is named by its prefix (``model.ckpt-28252``) or its ``.index`` file."""
    return path.suffix == ".index" or Path(str(path) + ".index").is_file()


def load_init_checkpoint(model: nn.Module, path: str | Path) -> int:
    """Fill ``model``'s parameters from the checkpoint at ``path`` (either form); returns the tensors loaded."""
    path = Path(path)
    if is_tf_checkpoint(path):
        return load_tf(model, path)
    return load_torch(model, path)


def load_torch(model: nn.Module, path: str | Path) -> int:
    """The PyTorch-converted state dict (NVIDIA's / HF's names)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: checkpoint file not found (config key 'model.init_checkpoint'; expected a PyTorch "
                        "state dict, or a TF checkpoint prefix with its .index file)")
    try:
        state: Any = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch raises many types for a bad file
        raise DataError(f"{path}: not a readable PyTorch checkpoint ({type(exc).__name__}: {exc})") from None
    for key in ("model", "state_dict"):
        if isinstance(state, Mapping) and key in state and isinstance(state[key], Mapping):
            state = state[key]
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise DataError(f"{path}: expected a state dict of tensors (bare or under 'model'), found {type(state).__name__}")
    tensors = {_torch_alias(k): v.detach().float().numpy() for k, v in state.items()}
    return _assign(model, tensors, {e.torch: e for e in entries(_layers(model))}, path, tf=False)


def load_tf(model: nn.Module, path: str | Path) -> int:
    """The TF v1 checkpoint, read by :mod:`.tf_bundle` (no TensorFlow)."""
    from .tf_bundle import read_bundle

    path = Path(path)
    prefix = path.with_suffix("") if path.suffix == ".index" else path
    tensors = {k: v for k, v in read_bundle(prefix).items() if not _TF_SKIP.search(k)}
    return _assign(model, tensors, {e.tf: e for e in entries(_layers(model))}, prefix, tf=True)


def _torch_alias(name: str) -> str:
    name = name.removeprefix("module.")
    name = name.replace(".dense_act.", ".dense.")  # NVIDIA's LinearActivation
    return re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name))


def _layers(model: nn.Module) -> int:
    return len(model.layers)  # type: ignore[arg-type]


def _assign(model: nn.Module, tensors: dict[str, np.ndarray], table: dict[str, Entry], where: Path, tf: bool) -> int:
    params = dict(model.named_parameters())
    extra = sorted(set(tensors) - set(table) - {_TIED, _DECODER_BIAS})
    missing = sorted(set(table) - set(tensors))
    form = "TF" if tf else "PyTorch"
    if missing:
        raise DataError(f"{where}: missing {len(missing)} tensor(s) of the BERT pretraining checkpoint ({form} names), "
                        f"e.g. {', '.join(missing[:5])}; a checkpoint of {_layers(model)} encoder layers is expected")
    if extra:
        raise DataError(f"{where}: {len(extra)} unexpected tensor(s), e.g. {', '.join(extra[:5])} (a {form} BERT "
                        f"pretraining checkpoint of {_layers(model)} encoder layers holds none of these)")
    hidden = params["pooler.weight"].shape[0]
    vocab = tensors[_key(table, "embeddings.word.weight")].shape[0]
    done: dict[str, torch.Tensor] = {}
    for name, e in table.items():
        value = tensors[name]
        if tf and e.tf_transposed:
            value = value.T
        target = params[e.ours]
        want = list(target.shape)
        if e.ours in ("embeddings.word.weight", "mlm_bias"):
            want[0] = vocab if vocab <= target.shape[0] else target.shape[0]
        if e.ours == "embeddings.position.weight" and value.ndim == 2 and value.shape[0] >= want[0]:
            value = value[: want[0]]
        if list(value.shape) != want:
            raise DataError(f"{where}: '{name}': expected shape {tuple(want)} for {e.ours} of the model "
                            f"(hidden {hidden}), found {tuple(value.shape)}")
        if not np.isfinite(value).all():
            raise DataError(f"{where}: '{name}': holds non-finite values")
        t = done.setdefault(e.ours, torch.zeros_like(target, device="cpu"))
        src = torch.from_numpy(np.ascontiguousarray(value, dtype=np.float32))
        t[: src.shape[0]] = src  # the vocabulary's padding rows stay zero
    _check_tied(tensors, tensors[_key(table, "embeddings.word.weight")], tensors[_key(table, "mlm_bias")], where)
    with torch.no_grad():
        for ours, t in done.items():
            params[ours].copy_(t.to(params[ours].device, params[ours].dtype))
    return len(table)


def _key(table: dict[str, Entry], ours: str) -> str:
    return next(k for k, e in table.items() if e.ours == ours)


def _check_tied(tensors: dict[str, np.ndarray], word: np.ndarray, bias: np.ndarray, where: Path) -> None:
    """A stored decoder (PyTorch form) must be the word embeddings (and its bias the output bias): ours is tied."""
    if _TIED in tensors and (tensors[_TIED].shape != word.shape or not np.array_equal(tensors[_TIED], word)):
        raise DataError(f"{where}: '{_TIED}' differs from 'bert.embeddings.word_embeddings.weight'; the model's "
                        "decoder is tied to the word embeddings (an untied checkpoint is not the reference's)")
    if _DECODER_BIAS in tensors and not np.array_equal(tensors[_DECODER_BIAS], bias):
        raise DataError(f"{where}: '{_DECODER_BIAS}' differs from 'cls.predictions.bias'")
