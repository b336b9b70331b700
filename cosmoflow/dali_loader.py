"""The DALI loader: CPU pipeline here, the same graph with GPU decode on clusters.

Plain TFRecord files are read by DALI's own ``fn.readers.tfrecord``, which needs one index file per
TFRecord file ("offset size" per record); they are made on first use by walking the record headers
(no payload is read). DALI's reader cannot read gzip-compressed TFRecords, so for the gzip dataset
the files are read and decompressed by a thread pool (zlib releases the GIL) and handed to the same
graph through ``fn.external_source``; to use the native reader, stage the data uncompressed
(``hpcbench datagen cosmoflow --plain`` writes it so). Both read the files in the order given by
:mod:`cosmoflow.sharding`, so they yield exactly the batches of the torch loader.
"""
from __future__ import annotations

import hashlib
import os
import struct
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from common.atomic import atomic_write_text
from common.errors import DataError
from common.workload import DataShard

from . import tfrecord
from .data import N_CHANNELS, N_TARGETS, read_sample

Batch = tuple[torch.Tensor, torch.Tensor]


def index_entries(path: Path) -> list[tuple[int, int]]:
    """(offset, size) of each record of a plain TFRecord file, from the headers only."""
    out: list[tuple[int, int]] = []
    total = path.stat().st_size
    with open(path, "rb") as fh:
        pos = 0
        while pos < total:
            head = fh.read(12)
            if len(head) < 12:
                raise DataError(f"{path}: truncated record header at byte {pos}")
            (length,) = struct.unpack("<Q", head[:8])
            if tfrecord.masked_crc(head[:8]) != struct.unpack("<I", head[8:])[0]:
                raise DataError(f"{path}: record at byte {pos}: length CRC-32C mismatch (corrupt file)")
            size = tfrecord.HEADER_BYTES + length + tfrecord.FOOTER_BYTES
            if pos + size > total:
                raise DataError(f"{path}: record at byte {pos} truncated ({size} bytes needed)")
            out.append((pos, size))
            pos += size
            fh.seek(pos)
    return out


def index_dir_for(root: str | Path, configured: str = "") -> Path:
    """``data.index_dir`` or ``<root>/.dali_index``; a per-user cache when the root is read-only."""
    if configured:
        return Path(configured)
    preferred = Path(root) / ".dali_index"
    try:
        preferred.mkdir(exist_ok=True)
        if os.access(preferred, os.W_OK):
            return preferred
    except OSError:
        pass
    digest = hashlib.sha1(str(Path(root).resolve()).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"hpcbench-dali-index-{os.getuid()}" / digest


def ensure_index(files: list[Path], index_dir: Path) -> list[Path]:
    """Index file paths for ``files``, writing missing ones atomically (safe if ranks race)."""
    out = []
    for f in files:
        idx = index_dir / f.parent.name / (f.name + ".idx")
        if not idx.exists() or idx.stat().st_mtime < f.stat().st_mtime:
            atomic_write_text(idx, "".join(f"{o} {s}\n" for o, s in index_entries(f)))
        out.append(idx)
    return out


class DaliLoader:
    """An :class:`~common.workload.EpochLoader` backed by a DALI pipeline rebuilt per epoch."""

    def __init__(self, files_for_epoch: Callable[[int], list[Path]], size: int, shard: DataShard,
                 index_dir: Path, threads: int = 2, prefetch: int = 2) -> None:
        self.files_for_epoch, self.size, self.shard = files_for_epoch, size, shard
        self.index_dir, self.threads, self.prefetch, self.epoch = index_dir, threads, prefetch, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return -(-len(self.files_for_epoch(self.epoch)) // self.shard.local_batch_size)

    def __iter__(self) -> Iterator[Batch]:
        files = self.files_for_epoch(self.epoch)
        if not files:
            return
        gz = tfrecord.is_gzip(files[0])
        if any(tfrecord.is_gzip(f) != gz for f in files):
            raise DataError(f"{files[0].parent}: mixes gzip and plain TFRecord files; DALI needs one kind")
        bs = self.shard.local_batch_size
        pool = ThreadPoolExecutor(self.threads) if gz else None
        pipe = self._pipeline(files, gz, pool)
        try:
            for start in range(0, len(files), bs):
                n = min(bs, len(files) - start)
                x, y = pipe.run()
                yield self._to_torch(x, n), self._to_torch(y, n)
        finally:
            del pipe
            if pool is not None:
                pool.shutdown()

    # --------------------------------------------------------------------------------------
    def _pipeline(self, files: list[Path], gz: bool, pool: ThreadPoolExecutor | None):  # -> Pipeline
        from nvidia.dali import fn, pipeline_def, types
        import nvidia.dali.math as dmath
        import nvidia.dali.tfrecord as tfrec

        S, bs = self.size, self.shard.local_batch_size
        cuda = self.shard.device.type == "cuda"

        def sample_batches() -> Iterator[tuple[list[np.ndarray], list[np.ndarray]]]:
            assert pool is not None
            for start in range(0, len(files), bs):
                samples = list(pool.map(lambda f: read_sample(f, S), files[start:start + bs]))
                yield [s.x for s in samples], [s.y for s in samples]

        @pipeline_def(batch_size=bs, num_threads=self.threads, prefetch_queue_depth=self.prefetch,
                      device_id=(self.shard.device.index or 0) if cuda else None, exec_dynamic=True)
        def graph():  # type: ignore[no-untyped-def]
            if gz:
                x, y = fn.external_source(source=sample_batches(), num_outputs=2,
                                          dtype=[types.INT16, types.FLOAT], layout=["DHWC", ""])
            else:
                rec = fn.readers.tfrecord(
                    path=[str(f) for f in files], index_path=[str(i) for i in ensure_index(files, self.index_dir)],
                    features={"x": tfrec.FixedLenFeature((), tfrec.string, ""),
                              "y": tfrec.FixedLenFeature([N_TARGETS], tfrec.float32, 0.0)},
                    random_shuffle=False, pad_last_batch=True, name="reader")
                x = fn.reinterpret(rec["x"], dtype=types.INT16, shape=[S, S, S, N_CHANNELS], layout="DHWC")
                y = rec["y"]
            if cuda:
                x, y = x.gpu(), y.gpu()
            x = dmath.log(fn.cast(x, dtype=types.FLOAT) + 1.0)
            return fn.transpose(x, perm=[3, 0, 1, 2], output_layout="CDHW"), y

        pipe = graph()
        pipe.build()
        return pipe

    def _to_torch(self, tl, n: int) -> torch.Tensor:  # tl: TensorList (CPU or GPU)
        from nvidia.dali.plugin.pytorch import feed_ndarray, to_torch_type

        tensor = tl.as_tensor()
        if self.shard.device.type == "cuda":
            out = torch.empty(tensor.shape(), dtype=to_torch_type[tensor.dtype], device=self.shard.device)
            feed_ndarray(tensor, out, cuda_stream=torch.cuda.current_stream(self.shard.device))
        else:
            out = torch.from_numpy(np.array(tensor))
        return out[:n]
