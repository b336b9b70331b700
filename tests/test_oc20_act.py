"""hpcbench.workloads.opencatalyst.act.silu: same values, gradients and second derivatives as torch's SiLU,
with the second derivative by the C pass (float64 and float32, one thread and several, NaN and extreme
inputs) and by the torch ops."""
import pytest
import torch
from torch.nn import functional as F

from hpcbench.workloads.opencatalyst import act
from hpcbench.workloads.opencatalyst.act import silu


@pytest.fixture(params=["c", "torch"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "torch":
        monkeypatch.setattr(act, "_c_gradgrad", lambda *args: None)
    elif act._c_gradgrad(*(torch.zeros(2, dtype=torch.float64),) * 3, True, True) is None:
        pytest.fail(f"the SiLU C kernel did not build here: {act.ckernel.reason(act.KERNEL_SOURCE)}")
    return request.param


def test_silu_matches_torch_to_second_order(path: str) -> None:
    torch.manual_seed(0)
    x = (torch.randn(40, 5, dtype=torch.float64) * 4).requires_grad_(True)
    w = torch.randn(5, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(silu, (x,))
    assert torch.autograd.gradgradcheck(silu, (x,))

    def force_loss(act):  # energy -> d/dx with a graph -> loss backward, as in training on forces
        e = act(act(x) @ w).sum()
        (gx,) = torch.autograd.grad(e, x, create_graph=True)
        return torch.autograd.grad(gx.pow(2).sum(), (x, w))

    for ours, ref in zip(force_loss(silu), force_loss(F.silu)):
        torch.testing.assert_close(ours, ref)
    torch.testing.assert_close(silu(x), F.silu(x))


@pytest.mark.parametrize("threads", [1, 3])
def test_c_pass_in_float32_matches_the_exact_formula(monkeypatch: pytest.MonkeyPatch, threads: int) -> None:
    """float32's vectorised exp: within a few float32 ulps of the formula in float64, over the whole
    range (saturated tails included), and NaN in gives NaN out."""
    if act._c_gradgrad(*(torch.zeros(2),) * 3, True, True) is None:
        pytest.fail(f"the SiLU C kernel did not build here: {act.ckernel.reason(act.KERNEL_SOURCE)}")
    monkeypatch.setattr(act, "MIN_ELEMENTS_PER_THREAD", 1)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x = torch.cat([torch.linspace(-120, 120, 20001), torch.tensor([0.0, -0.0, 1e-30, -1e-30, 88.5, -88.5,
                                                                      float("inf"), float("-inf"), float("nan")])])
        g, gout = torch.randn(x.shape), torch.randn(x.shape)
        dg, dx = act._c_gradgrad(gout, g, x, True, True)
    finally:
        torch.set_num_threads(old)
    x64, g64, o64 = x.double(), g.double(), gout.double()
    s = torch.sigmoid(x64)
    want_dg = o64 * s * (1 + x64 * (1 - s))
    want_dx = o64 * g64 * s * (1 - s) * (2 + x64 * (1 - 2 * s))
    finite = torch.isfinite(x)
    for got, want in ((dg, want_dg), (dx, want_dx)):
        # a few float32 ulps of the O(1) values; relative error grows only next to the zeros of silu' and silu''
        torch.testing.assert_close(got[finite].double(), want[finite], rtol=3e-6, atol=2e-6)
        # NaN propagates; an infinite input gives no finite value (torch gives NaN there: inf * 0), so the
        # trainer's finite checks still see it
        assert torch.isnan(got[-1]) and not torch.isfinite(got[-3:]).any()
    only_dx = act._c_gradgrad(gout, g, x, False, True)
    assert only_dx[0] is None
    torch.testing.assert_close(only_dx[1], dx, rtol=0, atol=0, equal_nan=True)
