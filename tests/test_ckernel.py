"""common.ckernel: a C source is built once per machine type into the cache folder and loaded; a damaged
cached library is rebuilt; with no compiler, a failing build or HPCBENCH_C_KERNELS=0 the caller gets None
and a reason (the torch path runs); an unwritable cache folder falls back to a private one."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hpcbench.common import ckernel
from hpcbench.workloads.opencatalyst import triplet

SOURCE = "int add_one(int x) { return x + 1; }\n"


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A private cache folder and no library loaded yet in this process."""
    monkeypatch.setattr(ckernel, "_loaded", {})
    monkeypatch.setattr(ckernel, "_reasons", {})
    monkeypatch.setenv("HPCBENCH_KERNEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HPCBENCH_C_KERNELS", raising=False)
    src = tmp_path / "tiny.c"
    src.write_text(SOURCE)
    return src


def test_built_once_then_loaded_from_the_cache(fresh: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lib = ckernel.load(fresh, ("add_one",))
    assert lib is not None and lib.add_one(41) == 42
    (built,) = (fresh.parent / "cache").glob("tiny-*.so")
    stamp = built.stat().st_mtime_ns
    monkeypatch.setattr(ckernel, "_loaded", {})  # as a new process would
    monkeypatch.setattr(ckernel, "_build", lambda *a: pytest.fail("rebuilt a cached library"))
    again = ckernel.load(fresh, ("add_one",))
    assert again is not None and again.add_one(1) == 2
    assert built.stat().st_mtime_ns == stamp
    assert not [p for p in built.parent.iterdir() if p.name.endswith(".tmp")]


def test_a_changed_source_gets_its_own_library(fresh: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert ckernel.load(fresh, ("add_one",)) is not None
    monkeypatch.setattr(ckernel, "_loaded", {})
    fresh.write_text(SOURCE.replace("x + 1", "x + 2"))
    lib = ckernel.load(fresh, ("add_one",))
    assert lib is not None and lib.add_one(1) == 3
    assert len(list((fresh.parent / "cache").glob("tiny-*.so"))) == 2


def test_a_damaged_cached_library_is_rebuilt(fresh: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert ckernel.load(fresh, ("add_one",)) is not None
    (built,) = (fresh.parent / "cache").glob("tiny-*.so")
    # the same name in another cache folder, damaged (a library this process has loaded cannot be
    # damaged under it and reopened: the loader would hand back the mapped one)
    other = tmp_path / "other-cache"
    other.mkdir()
    (other / built.name).write_bytes(b"not an ELF file")
    monkeypatch.setenv("HPCBENCH_KERNEL_CACHE", str(other))
    monkeypatch.setattr(ckernel, "_loaded", {})
    lib = ckernel.load(fresh, ("add_one",))
    assert lib is not None and lib.add_one(0) == 1
    assert (other / built.name).read_bytes()[:4] == b"\x7fELF"


def test_switched_off_by_the_environment(fresh: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HPCBENCH_C_KERNELS", "0")
    assert ckernel.load(fresh, ("add_one",)) is None
    assert "HPCBENCH_C_KERNELS is off" in ckernel.reason(fresh)
    # the OC20 ops then take their torch path
    monkeypatch.setattr(ckernel, "_loaded", {})
    assert triplet._kernels(torch.zeros(2, 2)) is None


def test_no_compiler_gives_none_and_says_so(fresh: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("CC", raising=False)
    assert ckernel.load(fresh, ("add_one",)) is None
    assert "no C compiler" in ckernel.reason(fresh)


def test_a_failing_build_names_the_file(fresh: Path) -> None:
    fresh.write_text("int add_one(int x) { return x + ; }\n")
    assert ckernel.load(fresh, ("add_one",)) is None
    why = ckernel.reason(fresh)
    assert "tiny.c" in why and "failed" in why
    assert not [p for p in (fresh.parent / "cache").iterdir() if p.suffix in (".so", ".tmp")]


def test_a_missing_symbol_is_a_failed_build(fresh: Path) -> None:
    assert ckernel.load(fresh, ("add_one", "add_two")) is None
    assert "add_two" in ckernel.reason(fresh)


def test_unwritable_cache_folder_falls_back(fresh: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("HPCBENCH_KERNEL_CACHE", str(blocker / "kernels"))  # a folder under a file: no mkdir
    lib = ckernel.load(fresh, ("add_one",))
    assert lib is not None and lib.add_one(2) == 3


def test_run_spans_runs_every_span_and_raises_the_first_error() -> None:
    seen: list[tuple[int, int, int]] = []
    ckernel.run_spans([(0, 3), (3, 5), (5, 9)], lambda i, s, e: seen.append((i, s, e)))
    assert sorted(seen) == [(0, 0, 3), (1, 3, 5), (2, 5, 9)]

    def bad(i: int, s: int, e: int) -> None:
        if i == 1:
            raise RuntimeError("span 1 failed")

    with pytest.raises(RuntimeError, match="span 1 failed"):
        ckernel.run_spans([(0, 1), (1, 2)], bad)


def test_a_forked_child_gets_its_own_threads() -> None:
    """The pool's threads do not survive fork(): a child that runs spans must not wait on them."""
    import os

    ckernel.run_spans([(0, 1), (1, 2)], lambda i, s, e: None)  # the parent's pool exists
    pid = os.fork()
    if pid == 0:  # child: run spans on threads again, exit 0 if they ran
        seen: list[int] = []
        try:
            ckernel.run_spans([(0, 1), (1, 2)], lambda i, s, e: seen.append(i))
        finally:
            os._exit(0 if sorted(seen) == [0, 1] else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_fallback_folder_others_can_write_is_not_used(fresh: Path, monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path: Path) -> None:
    """Library names are predictable: a fallback folder another user could write (pre-made with mode
    0777) would let them plant code, so no kernel is built or loaded from it."""
    import os
    import tempfile

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("HPCBENCH_KERNEL_CACHE", str(blocker / "kernels"))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    planted = tmp / f"hpcbench-kernels-{os.getuid()}"
    planted.mkdir()
    planted.chmod(0o777)
    assert ckernel.load(fresh, ("add_one",)) is None
    assert "private directory" in ckernel.reason(fresh)
    assert not list(planted.iterdir())


def test_cc_with_arguments_is_used_as_given(fresh: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fresh.write_text("int add_one(int x) {\n#ifdef PLUS_TEN\n return x + 10;\n#else\n return x + 1;\n#endif\n}\n")
    monkeypatch.setenv("CC", "gcc -DPLUS_TEN")
    lib = ckernel.load(fresh, ("add_one",))
    assert lib is not None and lib.add_one(1) == 11


def test_a_cached_library_without_the_symbols_is_replaced_and_not_returned(fresh: Path, monkeypatch: pytest.MonkeyPatch,
                                                                         tmp_path: Path) -> None:
    import subprocess

    assert ckernel.load(fresh, ("add_one",)) is not None
    (built,) = (fresh.parent / "cache").glob("tiny-*.so")
    stale = tmp_path / "stale-cache"
    stale.mkdir()
    other = tmp_path / "other.c"
    other.write_text("int unrelated(void) { return 1; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(stale / built.name), str(other)], check=True)
    monkeypatch.setenv("HPCBENCH_KERNEL_CACHE", str(stale))
    monkeypatch.setattr(ckernel, "_loaded", {})
    lib = ckernel.load(fresh, ("add_one",))
    assert lib is not None and lib.add_one(4) == 5


def test_built_libraries_are_readable_as_the_umask_allows(fresh: Path) -> None:
    from hpcbench.common.atomic import file_mode

    assert ckernel.load(fresh, ("add_one",)) is not None
    (built,) = (fresh.parent / "cache").glob("tiny-*.so")
    mode = file_mode()
    assert built.stat().st_mode & 0o777 == mode | (mode & 0o444) >> 2


@pytest.mark.parametrize("cpu_id, wide", [
    ("x86_64|Intel(R) Xeon(R) Processor|avx2 avx512bw avx512f fma", True),
    ("x86_64|AMD EPYC 9654|avx2 avx512_bf16 avx512f", True),
    ("x86_64|Intel(R) Core(TM) i7|avx2 avx512vl fma", False),  # no Foundation flag: not AVX-512
    ("x86_64|AMD EPYC 7763|avx2 fma", False),
    ("aarch64||asimd fp sve", False),
])
def test_512_bit_vectors_only_on_x86_with_avx512(cpu_id: str, wide: bool) -> None:
    flags = ckernel.cflags(cpu_id)
    assert flags[:len(ckernel.CFLAGS)] == ckernel.CFLAGS
    assert ("-mprefer-vector-width=512" in flags) is wide


def test_the_cache_key_follows_the_flags(fresh: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A library built with other flags (say, before 512-bit vectors were chosen) is not loaded for these."""
    assert ckernel.load(fresh, ("add_one",)) is not None
    monkeypatch.setattr(ckernel, "_loaded", {})
    monkeypatch.setattr(ckernel, "cflags", lambda cpu_id=None: ckernel.CFLAGS + ("-O2",))
    assert ckernel.load(fresh, ("add_one",)) is not None
    assert len(list((fresh.parent / "cache").glob("tiny-*.so"))) == 2


def test_row_strided_keeps_column_slices_and_copies_the_rest() -> None:
    wide = torch.arange(24.0).view(4, 6)
    cols = wide[:, 2:5]
    assert ckernel.row_strided(cols).data_ptr() == cols.data_ptr() and ckernel.row_strided(cols).stride() == (6, 1)
    for other in (wide.t(), wide[:, ::2], torch.arange(6.0)[::2]):
        got = ckernel.row_strided(other)
        assert got.is_contiguous() and torch.equal(got, other)
