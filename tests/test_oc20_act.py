"""hpcbench.workloads.opencatalyst.act.silu: same values, gradients and second derivatives as torch's SiLU."""
import torch
from torch.nn import functional as F

from hpcbench.workloads.opencatalyst.act import silu


def test_silu_matches_torch_to_second_order():
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
