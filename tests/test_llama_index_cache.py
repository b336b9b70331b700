"""llama31_8b's index cache (data.index_cache): a set loaded from the cache is the set built without it (every
array, every sample), for the training split, the cut evaluation set, document order and a blend's parts; it is
found again by the data's lengths (not its path), missed when the seed or a size changes; a damaged entry is named
and rebuilt; a failed write leaves no entry and the run goes on; ranks take turns on the build; settings resolve or
are refused by key."""
from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from hpcbench.common.errors import ConfigError
from hpcbench.workloads.mlperf_training.llama31_8b import gpt, index_cache
from hpcbench.workloads.mlperf_training.llama31_8b.blend import open_blend
from hpcbench.workloads.mlperf_training.llama31_8b.dataset import LlamaData
from hpcbench.workloads.mlperf_training.llama31_8b.index_cache import IndexCache
from tests.test_llama_data import _docs, independent_write

ARRAYS = ("document_index", "sample_index", "shuffle_index")


def _write_splits(root: Path, seed: int = 7) -> None:
    rng = np.random.RandomState(seed)
    for split, n in (("train", 80), ("validation", 30)):
        (root / split).mkdir(parents=True)
        independent_write(root / split / f"c4-{split}_text_document", _docs(rng, n, 500, empty=True), "int32")


def _same(a: gpt.GPTSamples, b: gpt.GPTSamples) -> None:
    assert len(a) == len(b)
    for name in ARRAYS:
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert np.array_equal(a.read(range(len(a))), b.read(range(len(b))))


def _no_build(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the index was built, not loaded")

    monkeypatch.setattr(gpt, "build_document_index", refuse)


@pytest.mark.parametrize("order", ["reference", "document"])
def test_a_cached_set_is_the_set_built_without_the_cache(tmp_path: Path, order: str,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    _write_splits(tmp_path / "data")
    spec = {"seq_len": 16, "vocab_size": 500, "seed": 3, "train_samples": 300, "eval_samples": 20,
            "eval_order": order, "eval_index_samples": 120 if order == "reference" else 0}
    plain = {s: LlamaData(**spec, index_cache="none").open(tmp_path / "data", s) for s in ("train", "validation")}
    assert not (tmp_path / "data" / ".index_cache").exists()
    first = {s: LlamaData(**spec, index_cache="auto").open(tmp_path / "data", s) for s in ("train", "validation")}
    said = capsys.readouterr().err
    assert said.count("built in") == 2 and str(tmp_path / "data" / ".index_cache") in said
    entries = sorted((tmp_path / "data" / ".index_cache").glob("*.json"))
    assert len(entries) == 2 and not list((tmp_path / "data" / ".index_cache").glob(".*.tmp"))
    _no_build(monkeypatch)
    again = {s: LlamaData(**spec, index_cache="auto").open(tmp_path / "data", s) for s in ("train", "validation")}
    assert capsys.readouterr().err == ""  # a hit says nothing
    for s in ("train", "validation"):
        _same(plain[s], first[s])
        _same(plain[s], again[s])
        assert isinstance(again[s].document_index, np.memmap)  # mapped, not copied: the ranks share the pages
    assert np.array_equal(again["validation"].chosen, plain["validation"].chosen) or order == "document"


def test_the_entry_follows_the_lengths_not_the_path_and_misses_on_another_seed_or_size(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write_splits(tmp_path / "a")
    cache = IndexCache(tmp_path / "cache")
    corpus = gpt.Corpus.open([tmp_path / "a" / "train" / "c4-train_text_document"], 500)
    built = gpt.GPTSamples(corpus, 16, 5, 200, cache=cache)
    shutil.copytree(tmp_path / "a", tmp_path / "b")  # the same data staged elsewhere
    moved = gpt.Corpus.open([tmp_path / "b" / "train" / "c4-train_text_document"], 500)
    with monkeypatch.context() as m:
        _no_build(m)
        _same(built, gpt.GPTSamples(moved, 16, 5, 200, cache=cache))
    for args in ((16, 6, 200), (16, 5, 201), (8, 5, 200)):  # seed, samples, sequence length
        other = gpt.GPTSamples(moved, *args, cache=cache)
        _same(other, gpt.GPTSamples(moved, *args))
    assert len(list((tmp_path / "cache").glob("*.json"))) == 4
    # other lengths (one document one token longer): another entry, not the old one
    rng = np.random.RandomState(7)
    docs = _docs(rng, 80, 500, empty=True)
    docs[3] = [*docs[3], 1]
    (tmp_path / "c").mkdir()
    independent_write(tmp_path / "c" / "doc", docs, "int32")
    changed = gpt.Corpus.open([tmp_path / "c" / "doc"], 500)
    _same(gpt.GPTSamples(changed, 16, 5, 200, cache=cache), gpt.GPTSamples(changed, 16, 5, 200))


def test_a_blends_parts_are_cached_each(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.RandomState(2)
    prefixes = []
    for name in ("p0", "p1"):
        independent_write(tmp_path / name, _docs(rng, 40, 300), "int32")
        prefixes.append(tmp_path / name)
    corpora = [gpt.Corpus.open([p], 300) for p in prefixes]
    plain = open_blend(corpora, [0.3, 0.7], 8, 4, 150)
    cache = IndexCache(tmp_path / "cache")
    open_blend(corpora, [0.3, 0.7], 8, 4, 150, cache)
    assert len(list((tmp_path / "cache").glob("*.json"))) == 2
    _no_build(monkeypatch)
    cached = open_blend(corpora, [0.3, 0.7], 8, 4, 150, cache)
    assert np.array_equal(plain.read(range(plain.size)), cached.read(range(cached.size)))


@pytest.mark.parametrize("damage", ["flip", "truncate", "missing", "json", "shape"])
def test_a_damaged_entry_is_named_and_rebuilt(tmp_path: Path, damage: str, capsys: pytest.CaptureFixture[str]) -> None:
    _write_splits(tmp_path / "data")
    corpus = gpt.Corpus.open([tmp_path / "data" / "train" / "c4-train_text_document"], 500)
    cache = IndexCache(tmp_path / "cache")
    plain = gpt.GPTSamples(corpus, 16, 5, 200)
    gpt.GPTSamples(corpus, 16, 5, 200, cache=cache)
    (meta,) = (tmp_path / "cache").glob("*.json")
    key = meta.name[: -len(".json")]
    target = tmp_path / "cache" / f"{key}.shuffle_index.npy"
    if damage == "flip":
        raw = bytearray(target.read_bytes())
        raw[-3] ^= 0x40
        target.write_bytes(bytes(raw))
    elif damage == "truncate":
        target.write_bytes(target.read_bytes()[:-8])
    elif damage == "missing":
        target.unlink()
    elif damage == "json":
        target = meta
        meta.write_text(meta.read_text()[:40])
    else:  # a sound .npy of another shape under the name
        np.save(target, np.arange(3, dtype=np.uint32))
    capsys.readouterr()
    again = gpt.GPTSamples(corpus, 16, 5, 200, cache=cache)
    err = capsys.readouterr().err
    assert str(target) in err and "rebuilding the index" in err and "built in" in err, err
    _same(plain, again)
    gpt.GPTSamples(corpus, 16, 5, 200, cache=cache)  # the rebuilt entry is sound
    assert capsys.readouterr().err == ""


def test_a_failed_write_leaves_no_entry_and_the_run_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    _write_splits(tmp_path / "data")
    corpus = gpt.Corpus.open([tmp_path / "data" / "train" / "c4-train_text_document"], 500)
    cache = IndexCache(tmp_path / "cache")
    real_save = np.save
    calls = []

    def full_disk(fh: object, a: np.ndarray, allow_pickle: bool = False) -> None:
        calls.append(a.shape)
        if len(calls) == 2:  # the second array: one is already stored under its final name
            raise OSError(errno.ENOSPC, "No space left on device")
        real_save(fh, a, allow_pickle=allow_pickle)

    monkeypatch.setattr(index_cache.np, "save", full_disk)
    got = gpt.GPTSamples(corpus, 16, 5, 200, cache=cache)
    err = capsys.readouterr().err
    assert "could not store the index" in err and "No space left on device" in err
    _same(got, gpt.GPTSamples(corpus, 16, 5, 200))
    assert not list((tmp_path / "cache").glob("*.json"))  # no entry: the next run builds again
    assert not list((tmp_path / "cache").glob("*.npy"))  # not even the array already renamed into place
    assert not list((tmp_path / "cache").glob(".*.tmp"))  # no temporaries left
    (mark,) = (tmp_path / "cache").glob("*.failed")
    monkeypatch.setattr(index_cache.np, "save", real_save)
    calls.clear()
    _same(got, gpt.GPTSamples(corpus, 16, 5, 200, cache=cache))  # within the hour: built, not stored again
    assert calls == [] and not list((tmp_path / "cache").glob("*.json")) and capsys.readouterr().err == ""
    old = mark.stat().st_mtime - index_cache.FAILED_S - 1
    os.utime(mark, (old, old))
    _same(got, gpt.GPTSamples(corpus, 16, 5, 200, cache=cache))  # the mark has expired: stored
    assert len(list((tmp_path / "cache").glob("*.json"))) == 1 and not mark.exists()


def test_after_a_failed_store_ranks_build_at_once_instead_of_taking_turns(tmp_path: Path) -> None:
    """A rank holds the turn (building); a store failed here lately: the others build at once, not after it."""
    cache = IndexCache(tmp_path / "cache", wait_s=30)
    cache.folder.mkdir()
    desc = {"class": "test", "n": 3}
    key = cache.key(desc)
    fd = os.open(cache.folder / f"{key}.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    (cache.folder / f"{key}.failed").write_text("No space left on device\n")
    t = time.monotonic()
    out = cache.get_or_build(desc, lambda: {"x": np.arange(4)})
    assert time.monotonic() - t < 5 and np.array_equal(out["x"], np.arange(4))
    assert not list(cache.folder.glob("*.json"))
    os.close(fd)


def test_an_entry_that_loads_is_never_replaced_and_old_entries_and_temporaries_are_pruned(tmp_path: Path) -> None:
    cache = IndexCache(tmp_path / "cache")
    cache.folder.mkdir()
    a = {"class": "test", "n": 1}
    cache.get_or_build(a, lambda: {"x": np.arange(5)})
    path = cache.folder / f"{cache.key(a)}.x.npy"
    inode = path.stat().st_ino
    cache._store(cache.key(a), a, {"x": np.arange(5)}, 0.0)  # another node's store of the same entry
    assert path.stat().st_ino == inode  # not renamed over: a rank may have it mapped
    # an entry unused for over KEEP_S and a killed writer's temporary: gone when another entry is stored
    past = time.time() - index_cache.KEEP_S - 60
    os.utime(cache.folder / f"{cache.key(a)}.json", (past, past))
    stale = cache.folder / ".x.npy.abcd.tmp"
    stale.write_bytes(b"partial")
    os.utime(stale, (past, past))
    fresh = cache.folder / ".y.npy.efgh.tmp"  # a writer at work now: kept
    fresh.write_bytes(b"partial")
    b = {"class": "test", "n": 2}
    cache.get_or_build(b, lambda: {"x": np.arange(6)})
    left = sorted(p.name for p in cache.folder.iterdir())
    assert not [n for n in left if n.startswith(cache.key(a))] and not stale.exists() and fresh.exists()
    assert f"{cache.key(b)}.json" in left
    # a load renews an entry's time: used entries stay
    os.utime(cache.folder / f"{cache.key(b)}.json", (past, past))
    cache.get_or_build(b, lambda: {"x": np.arange(6)})
    assert time.time() - (cache.folder / f"{cache.key(b)}.json").stat().st_mtime < 60


def test_an_entry_of_another_description_or_other_arrays_is_not_used(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    cache = IndexCache(tmp_path / "cache")
    cache.folder.mkdir()
    a = {"class": "test", "n": 1}
    cache.get_or_build(a, lambda: {"x": np.arange(5)})
    meta = cache.folder / f"{cache.key(a)}.json"
    edited = json.loads(meta.read_text())
    edited["description"]["n"] = 2  # as if two descriptions shared a key
    meta.write_text(json.dumps(edited))
    capsys.readouterr()
    out = cache.get_or_build(a, lambda: {"x": np.arange(5) + 1})
    assert np.array_equal(out["x"], np.arange(5) + 1) and "a description other than the one asked for" in \
        capsys.readouterr().err
    out = cache.get_or_build(a, lambda: {"x": np.arange(5)}, names=frozenset({"x", "y"}))
    assert np.array_equal(out["x"], np.arange(5)) and "expected ['x', 'y']" in capsys.readouterr().err


def test_ranks_take_turns_and_a_held_lock_does_not_hold_a_rank(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    cache = IndexCache(tmp_path / "cache", wait_s=0.6)
    cache.folder.mkdir()
    desc = {"class": "test", "n": 1}
    key = cache.key(desc)
    arrays = {"document_index": np.arange(10, dtype=np.int32)}
    # another rank holds the lock, stores the entry and lets go: the waiting rank loads it, building nothing
    fd = os.open(cache.folder / f"{key}.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    got: dict[str, object] = {}

    def never() -> dict[str, np.ndarray]:
        raise AssertionError("built while another rank was building")

    waiter = threading.Thread(target=lambda: got.update(cache.get_or_build(desc, never)))
    waiter.start()
    IndexCache(cache.folder)._store(key, desc, arrays, 0.1)
    fcntl.flock(fd, fcntl.LOCK_UN)
    waiter.join(10)
    assert not waiter.is_alive() and np.array_equal(got["document_index"], arrays["document_index"])
    # a holder that never lets go (a stopped rank): the waiter builds on its own after wait_s
    desc2 = {"class": "test", "n": 2}
    fd2 = os.open(cache.folder / f"{cache.key(desc2)}.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd2, fcntl.LOCK_EX)
    capsys.readouterr()
    out = cache.get_or_build(desc2, lambda: {"x": np.ones(3)})
    assert np.array_equal(out["x"], np.ones(3)) and "held by another process for over 1 s" in capsys.readouterr().err
    os.close(fd)
    os.close(fd2)


def test_settings_resolve_or_are_refused_by_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert index_cache.resolve("none", tmp_path) is None and index_cache.resolve("", tmp_path) is None
    auto = index_cache.resolve("auto", tmp_path)
    assert auto is not None and auto.folder == tmp_path / ".index_cache"
    named = index_cache.resolve(str(tmp_path / "elsewhere"), tmp_path)
    assert named is not None and named.folder.is_dir()
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match=r"config key 'data.index_cache': .*a_file/sub cannot be written"):
        index_cache.resolve(str(blocker / "sub"), tmp_path)
    # "auto" where the data root cannot be written (read-only shared storage): no cache, said, the run goes on
    assert index_cache.resolve("auto", blocker) is None
    assert "not used" in capsys.readouterr().err
    from hpcbench.workloads.mlperf_training.llama31_8b.config import LlamaDataConfig
    from hpcbench.workloads.mlperf_training.llama31_8b.workload import LlamaWorkload

    assert LlamaDataConfig().index_cache == "auto"  # the default; the workload hands the key to its data spec
    assert LlamaWorkload(LlamaWorkload.load_config("mini", ["data.index_cache=none"])).dataset().index_cache == "none"


def test_the_cache_folder_is_not_data_to_pack_or_stage(tmp_path: Path) -> None:
    """ROOT/.index_cache (the "auto" place) is hidden: scanning the data root for packing or copy-staging, with the
    workload's layout or the generic one, never takes it for a split or a file to distribute."""
    from hpcbench import registry
    from hpcbench.common.data.layout import GENERIC, scan

    _write_splits(tmp_path)
    LlamaData(16, 500, seed=3, train_samples=100, eval_samples=10, index_cache="auto").open(tmp_path, "train")
    assert list((tmp_path / ".index_cache").glob("*.npy"))
    for layout in (GENERIC, registry.layout("llama31_8b")):
        found = scan(tmp_path, layout)
        assert set(found) == {"train", "validation"}, layout.name
        assert not [f for files in found.values() for f in files if ".index_cache" in f]
