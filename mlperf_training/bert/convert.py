"""``hpcbench convert bert``: the data MLCommons distributes (TFRecords of the reference's
``create_pretraining_data.py``, and the 10,000-sample evaluation TFRecord) to our HDF5 layouts.

Each record is a ``tf.train.Example`` (read by :mod:`hpcbench.common.data.tfrecord`, no TensorFlow) with
the int64 features ``input_ids``, ``input_mask``, ``segment_ids`` (``max_seq_len`` each, zero-padded),
``masked_lm_positions``, ``masked_lm_ids`` (``max_pred`` each, zero-padded), ``next_sentence_labels`` (1)
and the float feature ``masked_lm_weights`` (``max_pred``: 1.0 on the used prediction slots, then 0.0);
the lengths come from the first record (the reference: 512 and 76) and every record must have them.

Source folder: ``train/`` and ``eval/`` sub-folders of TFRecord files, or the reference's flat folder
(``part-*`` training files, ``eval*`` evaluation file; where an ``eval_10k*`` file is there, it alone: the
README's ``eval_intermediate`` is the whole evaluation data it is picked from). Output: ``OUT/train/`` one shard per training
file, packed (``--layout packed``, the default: up to 3 sequences per row, :mod:`.packing`) or padded,
and ``OUT/eval/eval_00000.hdf5``, padded, in the record order (the reference's ``eval_10k`` file holds the
10,000-sequence eval set; a closed run refuses an ``eval/`` of any other size). The
conversion is written into a hidden sibling folder and renamed into place; a non-empty ``OUT`` is
refused unless ``--replace`` (then our own ``*.hdf5`` outputs there are removed once the new ones are
written). A record without a feature or with a wrong length is a DataError naming the file, the record
and the feature.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np

from hpcbench.common.data import tfrecord
from hpcbench.common.errors import ConfigError, DataError

from .facts import MAX_SEQ_PER_ROW, VOCAB_SIZE
from .format import Rows, check_rows, write_packed, write_padded

INT_FEATURES = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids",
                "next_sentence_labels")
FLOAT_FEATURES = ("masked_lm_weights",)


def split_files(src: Path) -> dict[str, list[Path]]:
    """The TFRecord files of each split under ``src`` (see the module's description)."""
    if not src.is_dir():
        raise ConfigError(f"--src {src}: not a folder (expected train/ and eval/ of TFRecords, or part-* and eval* files)")

    def files(folder: Path, pattern: str = "*") -> list[Path]:
        return sorted(p for p in folder.glob(pattern) if p.is_file() and not p.name.startswith("."))

    if (src / "train").is_dir() and (src / "eval").is_dir():
        found = {"train": files(src / "train"), "eval": files(src / "eval")}
    else:
        found = {"train": files(src, "part-*"), "eval": files(src, "eval*")}
    for split, paths in found.items():
        if not paths:
            raise DataError(f"--src {src}: no {split} TFRecord files (expected {src}/{split}/* or, flat, "
                            f"{'part-*' if split == 'train' else 'eval*'})")
    # the reference's README converts the whole evaluation data to eval_intermediate, then picks the 10,000-sample
    # eval_10k from it: where eval_10k is there, it alone is the evaluation set
    picked = [p for p in found["eval"] if p.name.startswith("eval_10k")]
    if picked and len(picked) < len(found["eval"]):
        left = [p.name for p in found["eval"] if p not in picked]
        print(f"convert bert: the evaluation set is {', '.join(p.name for p in picked)} (the reference's eval_10k); "
              f"not converted: {', '.join(left)}", flush=True)
        found["eval"] = picked
    return found


def read_records(path: Path, lengths: dict[str, int] | None) -> tuple[Rows, dict[str, int]]:
    """The records of one TFRecord file as rows of one sequence; ``lengths`` (feature -> length) from the
    first record of the conversion when None."""
    rows = Rows()
    data = tfrecord.read_file_bytes(path)
    for k, payload in enumerate(tfrecord.iter_records(data, str(path))):
        where = f"{path}: record {k}"
        feats = tfrecord.decode_example(payload, where)
        missing = [f for f in (*INT_FEATURES, *FLOAT_FEATURES) if f not in feats]
        if missing:
            raise DataError(f"{where}: missing feature(s) {', '.join(missing)} (a create_pretraining_data.py "
                            f"record has {', '.join((*INT_FEATURES, *FLOAT_FEATURES))})")
        arrays = {f: np.asarray(feats[f]) for f in (*INT_FEATURES, *FLOAT_FEATURES)}
        for f in INT_FEATURES:
            if arrays[f].dtype != np.int64:
                raise DataError(f"{where}: feature '{f}' must be an int64_list, found another kind")
        if arrays["masked_lm_weights"].dtype != np.float32:
            raise DataError(f"{where}: feature 'masked_lm_weights' must be a float_list, found another kind")
        if lengths is None:
            seq, pred = len(arrays["input_ids"]), len(arrays["masked_lm_positions"])
            lengths = {"input_ids": seq, "input_mask": seq, "segment_ids": seq, "masked_lm_positions": pred,
                       "masked_lm_ids": pred, "masked_lm_weights": pred, "next_sentence_labels": 1}
        wrong = [f"'{f}' has {len(arrays[f])} values, expected {n}" for f, n in lengths.items() if len(arrays[f]) != n]
        if wrong:
            raise DataError(f"{where}: {'; '.join(wrong)} (max_seq_length {lengths['input_ids']}, "
                            f"max_predictions_per_seq {lengths['masked_lm_positions']} from the first record)")
        _append(rows, arrays, where)
    if lengths is None:
        raise DataError(f"{path}: holds no records")
    return rows, lengths


def _append(rows: Rows, a: dict[str, np.ndarray], where: str) -> None:
    mask, weights = a["input_mask"], a["masked_lm_weights"]
    n, m = int(mask.sum()), int(np.count_nonzero(weights))
    if (mask[:n] != 1).any() or (mask[n:] != 0).any():
        raise DataError(f"{where}: 'input_mask' must be ones then zeros")
    if (weights[:m] != 1).any() or (weights[m:] != 0).any():
        raise DataError(f"{where}: 'masked_lm_weights' must be 1.0 on the used prediction slots, then 0.0")
    if (a["input_ids"][n:] != 0).any() or (a["masked_lm_positions"][m:] != 0).any() or (a["masked_lm_ids"][m:] != 0).any():
        raise DataError(f"{where}: input_ids past 'input_mask' and masked_lm_positions/ids past 'masked_lm_weights' "
                        "must be zero padding")
    rows.input_ids.append(a["input_ids"][:n].copy())
    rows.segment_ids.append(a["segment_ids"][:n].copy())
    rows.seq_lens.append(np.array([n], np.int64))
    rows.masked_lm_positions.append(a["masked_lm_positions"][:m].copy())
    rows.masked_lm_ids.append(a["masked_lm_ids"][:m].copy())
    rows.masked_lens.append(np.array([m], np.int64))
    rows.next_sentence_labels.append(a["next_sentence_labels"][:1].copy())


def _check_out(out: Path, replace: bool) -> None:
    if not out.exists():
        return
    if not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a folder")
    held = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    if held and not replace:
        shown = ", ".join(held[:5]) + (f" and {len(held) - 5} more" if len(held) > 5 else "")
        raise ConfigError(f"--out {out}: the output folder is not empty (it holds {shown}); every *.hdf5 under "
                          "train/ and eval/ is read as part of the dataset. Choose a new or empty --out, or pass "
                          "--replace to remove the converter's own outputs (train/*.hdf5, eval/*.hdf5) there first")


def convert(src: Path, out: Path, trust_pickle: bool = False, progress: bool = True, workers: int = 1,
            replace: bool = False, layout: str = "packed", vocab_size: int = VOCAB_SIZE) -> dict[str, int]:
    """Convert ``src`` to ``out`` (see the module's description); returns sequences per split."""
    del trust_pickle, workers  # TFRecords hold no code; one process
    if layout not in ("packed", "padded"):
        raise ConfigError(f"--layout {layout!r}: expected 'packed' or 'padded'")
    from . import packing

    out = out.resolve()
    if src.resolve() == out:
        raise ConfigError(f"--out must differ from the source folder {src}")
    _check_out(out, replace)
    found = split_files(src)
    stage = out.parent / f".{out.name}.converting.{os.getpid()}"
    counts: dict[str, int] = {}
    lengths: dict[str, int] | None = None
    try:
        for split in ("train", "eval"):
            files, total = found[split], 0
            for k, path in enumerate(files):
                rows, lengths = read_records(path, lengths)
                limits = {"max_seq_len": lengths["input_ids"], "max_pred": lengths["masked_lm_positions"],
                          "vocab_size": vocab_size}
                check_rows(rows, str(path), max_per_row=1, **limits)
                if split == "eval":
                    name = f"eval_{k:05d}.hdf5"
                    write_padded(stage / "eval" / name, rows, **limits)
                else:
                    name = f"part_{k:05d}_of_{len(files):05d}.hdf5"
                    if layout == "packed":
                        write_packed(stage / "train" / name, packing.pack(rows, lengths["input_ids"]),
                                     max_per_row=MAX_SEQ_PER_ROW, **limits)
                    else:
                        write_padded(stage / "train" / name, rows, **limits)
                total += len(rows)
                if progress:
                    print(f"convert bert: {path.name} -> {split}/{name} ({len(rows)} sequences)", flush=True)
            counts[split] = total
        _install(stage, out)
    finally:
        shutil.rmtree(stage, ignore_errors=True)  # nothing of a failed conversion stays behind
    return counts


def _install(stage: Path, out: Path) -> None:
    """Move the finished conversion into ``out``: one rename when it is new, else our old shards go first."""
    if not out.exists():
        os.replace(stage, out)
        return
    for split in ("train", "eval"):
        (out / split).mkdir(exist_ok=True)
        for old in (out / split).glob("*.hdf5"):
            old.unlink()
        for new in sorted((stage / split).iterdir()):
            os.replace(new, out / split / new.name)
