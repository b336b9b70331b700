"""The contract between a workload's data and the shared data layer.

A workload declares one :class:`DatasetSpec` (built from its config): its :class:`FileLayout`
(splits, sample file patterns, files every node needs), how to open a split as a
:class:`SampleSource` whose items are *validated* samples (format, checksums, feature presence,
dtype, shape: a bad file raises :class:`~common.errors.DataError` naming the file and what was
expected), how to collate samples into a batch, the batch transform that may run on the device,
the partition rule its training batches use, and (optionally) the same transform as a DALI graph.
Everything else (sampling, threads, prefetch, pinned copies, DALI plumbing, sizes over nodes,
datagen) lives once in :mod:`hpcbench.common.data`.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol

import numpy as np

from .layout import FileLayout
from .sampler import Partition


class SampleSource(Protocol):
    """The samples of one split that this rank can see; items are validated samples."""

    def __len__(self) -> int: ...

    def __getitem__(self, i: int) -> Any: ...

    def costs(self) -> np.ndarray:
        """Per-sample cost for the balanced partition (float, one per sample)."""
        ...


class FileSamples:
    """One sample per file: item ``i`` is ``read(files[i])``; uniform costs."""

    def __init__(self, files: Sequence[Path], read: Callable[[Path], Any]) -> None:
        self.files, self.read = list(files), read

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> Any:
        return self.read(self.files[i])

    def costs(self) -> np.ndarray:
        return np.ones(len(self.files))


class DaliGraph(Protocol):
    """A workload's batch transform as a DALI graph (see :mod:`hpcbench.common.data.dali`). A graph with a
    true ``host_inputs`` attribute gets its inputs on the host on a GPU run too and moves them
    itself (encoded images for DALI's "mixed" GPU decoder)."""

    def inputs(self, samples: Sequence[Any]) -> list[list[np.ndarray]]:
        """Per external-source output, one array per sample (raw, as read and validated)."""
        ...

    def layouts(self) -> list[str]: ...

    def dtypes(self) -> list[Any]:  # nvidia.dali.types.DALIDataType per input
        ...

    def graph(self, inputs: list[Any], device: str) -> list[Any]:
        """DALI ops from the external-source nodes to the outputs (``device``: cpu or gpu)."""
        ...

    def to_batch(self, outputs: list[Any]) -> Any:
        """The torch tensors of the pipeline's outputs as the batch the workload expects."""
        ...


class DatasetSpec(ABC):
    """What the data layer needs to know about one workload's dataset."""

    layout: ClassVar[FileLayout]
    partition: Partition = "contiguous"  # how batches are split over ranks (a spec may set it per config)
    # "shuffled": EpochSampler (a new order each epoch); "stored": StoredOrderSampler (the files' order,
    # contiguous global batches, O(batch) memory; DLRMv2, whose rules prohibit shuffling beyond the preprocessing)
    order: ClassVar[str] = "shuffled"
    train_split: str = "train"
    eval_split: str = "validation"

    @abstractmethod
    def open(self, root: Path, split: str) -> SampleSource:
        """The split's samples under ``root`` (lists files, checks files every node needs)."""

    def start(self, source: SampleSource) -> None:
        """Work on an opened split's samples that belongs inside the timed run (e.g. decoding the whole
        split into host memory): the harness calls it for every split it opened, right after ``run_start``
        (the rules start the clock before the data is touched). ``open`` itself reads only what the
        harness needs before it (file lists, sample counts, per-sample costs). Default: nothing."""

    @abstractmethod
    def collate(self, samples: Sequence[Any]) -> Any:
        """A host batch (tensors) from validated samples; runs in a reader thread."""

    def read_batch(self, source: SampleSource, indices: Sequence[int], pin: bool = False) -> Any:
        """The host batch of ``source``'s samples ``indices``, validated as ``source[i]`` validates
        them; runs in a reader thread. ``pin``: the batch goes to a GPU next (page-locked memory
        saves the loader a copy). Default: ``collate`` of the samples; a spec may read each sample
        straight into its slot of the batch instead (no collate copy)."""
        return self.collate([source[int(i)] for i in indices])

    def model_batch(self, source: SampleSource, n: int) -> Any:
        """A transformed batch of the first ``n`` samples of ``source`` in the form the model takes
        (the harness times the model on it to choose a memory layout). Default: ``transform`` of
        ``read_batch``; a spec whose samples are not model input until a DALI graph has run them
        (encoded images) reads them in a decoded form here instead."""
        return self.transform(self.read_batch(source, range(n)))

    def batch_cacheable(self, train: bool) -> bool:
        """False where ``read_batch`` draws random augmentation for the split (``train``): a cached
        batch would freeze it, so ``data.cache`` keeps the validated samples and augments them again."""
        return True

    def transform(self, batch: Any) -> Any:
        """Batch transform in torch ops (e.g. ``log1p``, a layout change). It runs in the reader
        thread when training on the CPU and on the device after the copy on a GPU, so the storage
        dtype crosses the bus."""
        return batch

    def transform_rows(self, stored: Any, rows: np.ndarray) -> Any | None:
        """``transform`` of the batch made of rows ``rows`` (slot numbers, int64) of ``stored``: the host
        cache's batch of every cached sample in the storage dtype (``data.cache = "host"`` on the CPU).
        A spec whose transform works sample by sample may read each sample straight from its cache row
        here, so a cached batch costs one pass over memory, not a gather copy and then the transform;
        the result must equal ``transform`` of the gathered rows exactly. None (the default): not
        offered; the cache gathers the rows into a batch and ``transform`` runs on that."""
        return None

    def dali(self) -> DaliGraph | None:
        """The DALI form of :meth:`transform` (``train.loader = "dali"``); None: not offered."""
        return None

    def dali_for(self, train: bool) -> DaliGraph | None:
        """The graph of the training or the evaluation loader (one whose training augmentation is
        random gives two); default: :meth:`dali` for both."""
        return self.dali()
