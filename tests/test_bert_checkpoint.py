"""The phase-1 checkpoint onto our BERT: the PyTorch-converted state dict (NVIDIA's names) and the TF v1
tensor bundle read without TensorFlow. Both files are written here by independent writers from the
published formats (a state dict of reference names; an SSTable of BundleEntryProto records with masked
crc32c), loaded, and every parameter compared; missing, unexpected, mis-shaped and corrupt input fails by name."""
from __future__ import annotations

import struct
from pathlib import Path

import crc32c
import numpy as np
import pytest
import torch

from hpcbench.common.errors import ConfigError, DataError
from hpcbench.workloads.mlperf_training.bert.checkpoint_load import load_init_checkpoint
from hpcbench.workloads.mlperf_training.bert.model import BertForPretraining, ModelConfig
from hpcbench.workloads.mlperf_training.bert.workload import BertWorkload

H, I, L, V, P = 16, 32, 2, 30, 20  # hidden, intermediate, layers, vocabulary (padded to 32), stored positions
CFG = ModelConfig(vocab_size=V, hidden=H, layers=L, heads=2, intermediate=I, max_position=12)


def reference_weights(seed: int = 0) -> dict[str, np.ndarray]:
    """Random weights under the reference's PyTorch names (HF/NVIDIA BertForPreTraining), torch layouts."""
    g = np.random.default_rng(seed)
    w: dict[str, np.ndarray] = {}

    def put(name: str, *shape: int) -> None:
        w[name] = g.standard_normal(shape).astype(np.float32)

    put("bert.embeddings.word_embeddings.weight", V, H)
    put("bert.embeddings.position_embeddings.weight", P, H)
    put("bert.embeddings.token_type_embeddings.weight", 2, H)
    for n in ["bert.embeddings.LayerNorm"] + [f"bert.encoder.layer.{k}.{s}.LayerNorm" for k in range(L)
                                             for s in ("attention.output", "output")] + ["cls.predictions.transform.LayerNorm"]:
        put(f"{n}.weight", H)
        put(f"{n}.bias", H)
    for k in range(L):
        t = f"bert.encoder.layer.{k}"
        for d in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
            put(f"{t}.{d}.weight", H, H)
            put(f"{t}.{d}.bias", H)
        put(f"{t}.intermediate.dense.weight", I, H)
        put(f"{t}.intermediate.dense.bias", I)
        put(f"{t}.output.dense.weight", H, I)
        put(f"{t}.output.dense.bias", H)
    for d in ("bert.pooler.dense", "cls.predictions.transform.dense"):
        put(f"{d}.weight", H, H)
        put(f"{d}.bias", H)
    put("cls.predictions.bias", V)
    put("cls.seq_relationship.weight", 2, H)
    put("cls.seq_relationship.bias", 2)
    return w


def assert_loaded(model: BertForPretraining, w: dict[str, np.ndarray]) -> None:
    p = {k: v.detach().numpy() for k, v in model.named_parameters()}
    eq = np.testing.assert_array_equal
    eq(p["embeddings.word.weight"][:V], w["bert.embeddings.word_embeddings.weight"])
    assert not p["embeddings.word.weight"][V:].any() and not p["mlm_bias"][V:].any()  # vocabulary padding zeroed
    eq(p["embeddings.position.weight"], w["bert.embeddings.position_embeddings.weight"][:12])
    eq(p["embeddings.segment.weight"], w["bert.embeddings.token_type_embeddings.weight"])
    eq(p["embeddings.norm.weight"], w["bert.embeddings.LayerNorm.weight"])
    for k in range(L):
        t = f"bert.encoder.layer.{k}"
        for n in ("query", "key", "value"):  # three parameters, as the reference's three variables
            eq(p[f"layers.{k}.attention.{n}.weight"], w[f"{t}.attention.self.{n}.weight"])
            eq(p[f"layers.{k}.attention.{n}.bias"], w[f"{t}.attention.self.{n}.bias"])
        eq(p[f"layers.{k}.attention.out.weight"], w[f"{t}.attention.output.dense.weight"])
        eq(p[f"layers.{k}.attention_norm.bias"], w[f"{t}.attention.output.LayerNorm.bias"])
        eq(p[f"layers.{k}.ffn_in.weight"], w[f"{t}.intermediate.dense.weight"])
        eq(p[f"layers.{k}.ffn_out.weight"], w[f"{t}.output.dense.weight"])
        eq(p[f"layers.{k}.ffn_norm.weight"], w[f"{t}.output.LayerNorm.weight"])
    eq(p["pooler.weight"], w["bert.pooler.dense.weight"])
    eq(p["mlm_transform.weight"], w["cls.predictions.transform.dense.weight"])
    eq(p["mlm_norm.bias"], w["cls.predictions.transform.LayerNorm.bias"])
    eq(p["mlm_bias"][:V], w["cls.predictions.bias"])
    eq(p["nsp.weight"], w["cls.seq_relationship.weight"])
    eq(p["nsp.bias"], w["cls.seq_relationship.bias"])


# --- the PyTorch-converted state dict ------------------------------------------------------------
def nvidia_state(w: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """NVIDIA's converted names: LinearActivation layers are 'dense_act'; the tied decoder is stored too."""
    sd = {}
    for k, v in w.items():
        name = k.replace("intermediate.dense.", "intermediate.dense_act.").replace("pooler.dense.", "pooler.dense_act.")
        sd[name] = torch.from_numpy(v.copy())
    sd["cls.predictions.decoder.weight"] = sd["bert.embeddings.word_embeddings.weight"].clone()
    return sd


def test_pytorch_state_dict_loads_every_tensor(tmp_path: Path) -> None:
    w = reference_weights()
    path = tmp_path / "model.ckpt-28252.pt"
    torch.save({"model": nvidia_state(w)}, path)
    model = BertForPretraining(CFG)
    assert load_init_checkpoint(model, path) == len(w)
    assert_loaded(model, w)
    bare = tmp_path / "bare.pt"  # a bare state dict with DDP's 'module.' prefix
    torch.save({f"module.{k}": torch.from_numpy(v.copy()) for k, v in w.items()}, bare)
    again = BertForPretraining(CFG)
    load_init_checkpoint(again, bare)
    assert_loaded(again, w)


@pytest.mark.parametrize("change,match", [
    ("drop", r"missing 1 tensor\(s\).*bert.encoder.layer.1.attention.self.key.weight"),
    ("extra", r"1 unexpected tensor\(s\), e.g. bert.encoder.layer.2.output.dense.bias"),
    ("shape", r"'bert.encoder.layer.0.intermediate.dense.weight': expected shape \(32, 16\).*found \(32, 8\)"),
    ("untied", r"'cls.predictions.decoder.weight' differs from 'bert.embeddings.word_embeddings.weight'"),
    ("nan", r"'cls.seq_relationship.bias': holds non-finite values"),
])
def test_pytorch_state_dict_errors_name_the_tensor(tmp_path: Path, change: str, match: str) -> None:
    w = reference_weights()
    sd = {k: torch.from_numpy(v.copy()) for k, v in w.items()}
    if change == "drop":
        del sd["bert.encoder.layer.1.attention.self.key.weight"]
    elif change == "extra":
        sd["bert.encoder.layer.2.output.dense.bias"] = torch.zeros(H)
    elif change == "shape":
        sd["bert.encoder.layer.0.intermediate.dense.weight"] = torch.zeros(I, 8)
    elif change == "untied":
        sd["cls.predictions.decoder.weight"] = torch.zeros(V, H)
    else:
        sd["cls.seq_relationship.bias"] = torch.tensor([0.0, float("nan")])
    path = tmp_path / "bad.pt"
    torch.save(sd, path)
    with pytest.raises(DataError, match=match):
        load_init_checkpoint(BertForPretraining(CFG), path)


def test_unreadable_or_absent_checkpoint_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "junk.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(DataError, match="junk.pt: not a readable PyTorch checkpoint"):
        load_init_checkpoint(BertForPretraining(CFG), bad)
    with pytest.raises(DataError, match="nothing.pt: checkpoint file not found"):
        load_init_checkpoint(BertForPretraining(CFG), tmp_path / "nothing.pt")


def test_closed_run_requires_the_checkpoint_and_an_open_run_loads_it(tmp_path: Path) -> None:
    small = ["model.vocab_size=30", "model.hidden=16", "model.layers=2", "model.heads=2", "model.intermediate=32",
             "data.max_seq_len=12"]
    with pytest.raises(ConfigError, match="'model.init_checkpoint': the closed division starts from"):
        BertWorkload(BertWorkload.load_config("full", small)).build_model()
    w = reference_weights()
    path = tmp_path / "ckpt.pt"
    torch.save(nvidia_state(w), path)
    for preset in ("full", "mini"):
        model = BertWorkload(BertWorkload.load_config(preset, [*small, f"model.init_checkpoint={path}"])).build_model()
        assert_loaded(model, w)


# --- the TF v1 checkpoint (tensor bundle), written by an independent writer ------------------------
def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _masked(data: bytes) -> int:
    c = crc32c.crc32c(data)
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def _field(number: int, wire: int, payload: bytes) -> bytes:
    return _varint(number << 3 | wire) + payload


def _entry_proto(dtype: int, shape: tuple[int, ...], offset: int, size: int, crc: int) -> bytes:
    dims = b"".join(_field(2, 2, _varint(len(d)) + d) for d in (_field(1, 0, _varint(s)) for s in shape))
    return (_field(1, 0, _varint(dtype)) + _field(2, 2, _varint(len(dims)) + dims) + _field(3, 0, _varint(0))
            + _field(4, 0, _varint(offset)) + _field(5, 0, _varint(size)) + _field(6, 5, struct.pack("<I", crc)))


def _block(entries: list[tuple[bytes, bytes]]) -> bytes:
    """A LevelDB block without prefix sharing: every entry is a restart point."""
    body, restarts = bytearray(), []
    for k, v in entries:
        restarts.append(len(body))
        body += _varint(0) + _varint(len(k)) + _varint(len(v)) + k + v
    restarts = restarts or [0]
    return bytes(body) + b"".join(struct.pack("<I", r) for r in restarts) + struct.pack("<I", len(restarts))


def write_tf_checkpoint(prefix: Path, tensors: dict[str, np.ndarray]) -> None:
    data, entries = bytearray(), []
    for name in sorted(tensors):
        raw = np.ascontiguousarray(tensors[name], dtype="<f4").tobytes()
        entries.append((name.encode(), _entry_proto(1, tensors[name].shape, len(data), len(raw), _masked(raw))))
        data += raw
    header = _field(1, 0, _varint(1)) + _field(2, 0, _varint(0))  # one shard, little-endian
    Path(f"{prefix}.data-00000-of-00001").write_bytes(bytes(data))
    out = bytearray()

    def put(block: bytes) -> bytes:
        handle = _varint(len(out)) + _varint(len(block))
        out.extend(block + b"\x00" + struct.pack("<I", _masked(block + b"\x00")))
        return handle

    data_handle = put(_block([(b"", header), *entries]))
    meta = put(_block([]))
    index = put(_block([(entries[-1][0] + b"\xff", data_handle)]))
    footer = meta + index
    out += footer + b"\x00" * (40 - len(footer)) + struct.pack("<Q", 0xDB4775248B80FB57)
    Path(f"{prefix}.index").write_bytes(bytes(out))


def tf_names(w: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The reference's TF names and layouts: dense kernels (in, out), LayerNorm gamma/beta, output_weights (2, H)."""
    out = {}
    for k, v in w.items():
        name = k.replace(".", "/").replace("/LayerNorm/weight", "/LayerNorm/gamma").replace("/LayerNorm/bias", "/LayerNorm/beta")
        for n in range(L):
            name = name.replace(f"encoder/layer/{n}/", f"encoder/layer_{n}/")
        if name.endswith("_embeddings/weight"):
            name = name.removesuffix("/weight")
        elif name == "cls/predictions/bias":
            name = "cls/predictions/output_bias"
        elif name.startswith("cls/seq_relationship/"):
            name = name.replace("/weight", "/output_weights").replace("/bias", "/output_bias")
        elif name.endswith("/weight") and "LayerNorm" not in name:
            name, v = name.removesuffix("/weight") + "/kernel", v.T
        out[name] = v
    return out


def test_tf_checkpoint_loads_without_tensorflow(tmp_path: Path) -> None:
    w = reference_weights(3)
    tf = tf_names(w)
    assert "bert/encoder/layer_0/attention/self/query/kernel" in tf and "cls/predictions/output_bias" in tf
    tf["bert/encoder/layer_0/attention/self/query/kernel/adam_m"] = np.zeros((H, H), np.float32)  # optimizer slots
    tf["global_step"] = np.zeros((), np.float32)
    prefix = tmp_path / "model.ckpt-28252"
    write_tf_checkpoint(prefix, tf)
    for given in (prefix, Path(f"{prefix}.index")):
        model = BertForPretraining(CFG)
        assert load_init_checkpoint(model, given) == len(w)
        assert_loaded(model, w)


def test_corrupt_tf_checkpoint_fails_by_name(tmp_path: Path) -> None:
    prefix = tmp_path / "model.ckpt-1"
    write_tf_checkpoint(prefix, tf_names(reference_weights()))
    data = Path(f"{prefix}.data-00000-of-00001")
    index = Path(f"{prefix}.index")
    good_data, good_index = data.read_bytes(), index.read_bytes()
    flipped = bytearray(good_data)
    flipped[100] ^= 0xFF
    data.write_bytes(bytes(flipped))
    with pytest.raises(DataError, match=r"data-00000-of-00001: tensor '.*': crc32c mismatch"):
        load_init_checkpoint(BertForPretraining(CFG), prefix)
    data.write_bytes(good_data[: len(good_data) // 2])
    with pytest.raises(DataError, match=r"lie past the file's \d+ \(truncated\)"):
        load_init_checkpoint(BertForPretraining(CFG), prefix)
    data.write_bytes(good_data)
    bad_index = bytearray(good_index)
    bad_index[10] ^= 0x01  # inside the data block: its crc no longer matches
    index.write_bytes(bytes(bad_index))
    with pytest.raises(DataError, match=r"model.ckpt-1.index: crc32c mismatch in the block at offset 0"):
        load_init_checkpoint(BertForPretraining(CFG), prefix)
    index.write_bytes(good_index[:-20])
    with pytest.raises(DataError, match="not a TF checkpoint index"):
        load_init_checkpoint(BertForPretraining(CFG), prefix)
    index.write_bytes(good_index)
    data.unlink()
    with pytest.raises(DataError, match="the checkpoint's data file is missing"):
        load_init_checkpoint(BertForPretraining(CFG), prefix)
