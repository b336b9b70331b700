"""opencatalyst.triplet: the chunked triplet message equals the plain gather/scatter formula to second
order (training on forces differentiates it twice), in one chunk and in many, with unsorted indices."""
from __future__ import annotations

import pytest
import torch

from hpcbench.workloads.opencatalyst import model as model_mod
from hpcbench.workloads.opencatalyst import triplet
from hpcbench.workloads.opencatalyst.model import DimeNetPP, DimeNetPPConfig, _NarrowLinear, energy_and_forces
from hpcbench.workloads.opencatalyst.triplet import triplet_message


def plain(a: torch.Tensor, b: torch.Tensor, w: torch.Tensor, kj: torch.Tensor, ji: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(a).index_add_(0, ji, a.index_select(0, kj) * (b @ w))


@pytest.mark.parametrize("chunk", [7, 10_000])
def test_message_matches_plain_formula_to_second_order(monkeypatch: pytest.MonkeyPatch, chunk: int) -> None:
    monkeypatch.setattr(triplet, "CPU_CHUNK", chunk)
    g = torch.Generator().manual_seed(0)
    e, t, k, c = 13, 50, 3, 4
    a = torch.randn(e, c, dtype=torch.float64, generator=g, requires_grad=True)
    b2 = torch.randn(t, 2 * k, dtype=torch.float64, generator=g, requires_grad=True)  # b: a strided column view
    w = torch.randn(k, c, dtype=torch.float64, generator=g, requires_grad=True)
    kj, ji = torch.randint(0, e, (t,), generator=g), torch.randint(0, e, (t,), generator=g)  # ji unsorted

    def ours(a, b2, w):  # noqa: ANN001, ANN202
        return triplet_message(a, b2[:, k:], w, kj, ji)

    torch.testing.assert_close(ours(a, b2, w), plain(a, b2[:, k:], w, kj, ji), rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(ours, (a, b2, w))
    assert torch.autograd.gradgradcheck(ours, (a, b2, w))


def test_narrow_linear_to_second_order() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(9, 3, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(5, 3, dtype=torch.float64, generator=g, requires_grad=True)
    torch.testing.assert_close(_NarrowLinear.apply(x, w), x @ w.t())
    assert torch.autograd.gradcheck(_NarrowLinear.apply, (x, w))
    assert torch.autograd.gradgradcheck(_NarrowLinear.apply, (x, w))


def test_training_step_gradients_equal_plain_autograd(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whole model, float64, the benchmark's step (forces with a graph, loss on forces + energy,
    backward): every parameter gradient equals the one with the plain formula in place of the op."""
    from tests.test_oc20_model import molecule_batch

    monkeypatch.setattr(triplet, "CPU_CHUNK", 64)  # many chunks on this small batch
    torch.manual_seed(0)
    model = DimeNetPP(DimeNetPPConfig(hidden=16, out_emb=16, int_emb=8, blocks=2)).double()
    with torch.no_grad():
        model.out.final.normal_(0, 0.1)
    b = molecule_batch(1)

    def grads() -> list[torch.Tensor]:
        model.zero_grad()
        e, f = energy_and_forces(model, b["z"], b["pos"], b["edge_index"], None, b["kj"], b["ji"], b["batch"],
                                 b["g"], True)
        (f.pow(2).mean() + e.sum()).backward()
        return [p.grad.clone() for p in model.parameters()]

    ours = grads()
    monkeypatch.setattr(model_mod, "triplet_message", plain)
    ref = grads()
    assert any(r.abs().max() > 0 for r in ref)
    for o, r in zip(ours, ref):
        torch.testing.assert_close(o, r, rtol=1e-9, atol=1e-12)
