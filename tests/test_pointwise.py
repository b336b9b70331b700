"""common/data/pointwise.py: the one-pass host transforms give exactly (bit for bit) what the torch
formulas they replace give, for every int16 value and in both layouts, across piece boundaries."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hpcbench.common.data import pointwise
from hpcbench.common.data.pointwise import Int16Table, ShiftScale

EVERY_INT16 = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16)  # 0..32767, then -32768..-1


def bits(t: torch.Tensor) -> torch.Tensor:
    """float32 as its bit patterns (NaN payloads and the sign of zero count)."""
    return t.contiguous().view(torch.int32)


@pytest.mark.parametrize("channels_first", [False, True])
@pytest.mark.parametrize("piece", [pointwise.PIECE, 1000], ids=["piece-default", "piece-1000"])
def test_log1p_lookup_is_bit_equal_to_the_float32_formula_for_every_int16(channels_first: bool, piece: int,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pointwise, "PIECE", piece)  # 1000: many pieces per sample, rows cut mid-sample
    x = EVERY_INT16[torch.randperm(1 << 16, generator=torch.Generator().manual_seed(1))].view(4, 8, 16, 32, 4)
    want = torch.log1p(x.to(torch.float32))  # the transform before the table: cast, then log1p
    table = Int16Table(torch.log1p)
    out = np.empty((4, 4, 8, 16, 32) if channels_first else (4, 8, 16, 32, 4), np.float32)
    table.into(x.numpy(), out, channels_first=channels_first)
    got = torch.from_numpy(out)
    if channels_first:
        got = got.permute(0, 2, 3, 4, 1)
    assert torch.equal(bits(got), bits(want))
    # the edges as the formula has them: -1 -> -inf, below -1 -> NaN, 0 -> 0, the largest count
    flat = dict(zip(x.reshape(-1).tolist(), got.reshape(-1).tolist()))
    assert flat[-1] == -np.inf and np.isnan(flat[-2]) and np.isnan(flat[-32768]) and flat[0] == 0.0
    assert flat[32767] == pytest.approx(np.log1p(32767.0), rel=1e-6)


@pytest.mark.parametrize("channels_first", [False, True])
def test_lookup_reads_samples_picked_out_of_a_larger_array(channels_first: bool) -> None:
    store = torch.randint(-5, 3000, (6, 4, 5, 6, 3), dtype=torch.int16).numpy()
    picked = [store[5], store[0], store[5]]
    out = np.empty((3, 3, 4, 5, 6) if channels_first else (3, 4, 5, 6, 3), np.float32)
    Int16Table(torch.log1p).into(picked, out, channels_first=channels_first)
    want = torch.log1p(torch.from_numpy(store[[5, 0, 5]]).to(torch.float32))
    got = torch.from_numpy(out).permute(0, 2, 3, 4, 1) if channels_first else torch.from_numpy(out)
    assert torch.equal(bits(got), bits(want))


@pytest.mark.parametrize("channels_first", [False, True])
@pytest.mark.parametrize("piece", [pointwise.PIECE, 700], ids=["piece-default", "piece-700"])
def test_shift_scale_is_bit_equal_to_sub_then_mul(channels_first: bool, piece: int,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pointwise, "PIECE", piece)
    g = torch.Generator().manual_seed(2)
    c = 5
    x = torch.randn(3, 10, 14, c, generator=g) * 300 + 7
    shift = torch.randn(c, generator=g) * 50
    scale = 1.0 / (torch.rand(c, generator=g) * 90 + 0.3)
    want = torch.sub(x, shift).mul_(scale)  # the torch formula: two float32 roundings
    out = np.empty((3, c, 10, 14) if channels_first else (3, 10, 14, c), np.float32)
    ShiftScale(shift.numpy(), scale.numpy()).into(x.numpy(), out, channels_first=channels_first)
    got = torch.from_numpy(out)
    if channels_first:
        got = got.permute(0, 2, 3, 1)
    assert torch.equal(bits(got), bits(want))
    fused = torch.addcmul(-shift * scale, x, scale)  # x*scale - shift*scale: not the formula, and it shows
    assert not torch.equal(bits(fused), bits(want))


def test_wrong_shapes_and_dtypes_are_refused_by_name() -> None:
    table = Int16Table(torch.log1p)
    x = np.zeros((2, 3, 3, 3, 4), np.int16)
    with pytest.raises(ValueError, match=r"output must be C-contiguous \(2, 4, 3, 3, 3\)"):
        table.into(x, np.empty((2, 3, 3, 3, 4), np.float32), channels_first=True)
    with pytest.raises(ValueError, match="int16 samples and a float32 output"):
        table.into(x.astype(np.int32), np.empty((2, 3, 3, 3, 4), np.float32))
    with pytest.raises(ValueError, match="every sample must be C-contiguous"):
        table.into([x[0], x[1, :2]], np.empty((2, 3, 3, 3, 4), np.float32))
    ss = ShiftScale(np.zeros(4, np.float32), np.ones(4, np.float32))
    with pytest.raises(ValueError, match="samples have 3 channels; shift/scale have 4"):
        ss.into(np.zeros((1, 2, 2, 3), np.float32), np.empty((1, 2, 2, 3), np.float32))
    with pytest.raises(ValueError, match="fn must map float32"):
        Int16Table(lambda v: v.double())


def test_scratch_is_kept_per_thread_no_allocation_per_call() -> None:
    table = Int16Table(torch.log1p)
    x = np.ones((2, 8, 8, 8, 4), np.int16)
    out = np.empty((2, 4, 8, 8, 8), np.float32)
    table.into(x, out, channels_first=True)
    kept = {k: v.ctypes.data for k, v in table._local.arrays.items()}
    table.into(x, out, channels_first=True)
    assert kept and {k: v.ctypes.data for k, v in table._local.arrays.items()} == kept
