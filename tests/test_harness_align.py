"""Every parameter and gradient view of the flat buffers starts on a 256-byte boundary (cuDNN's
channels-last kernels need aligned pointers: unaligned views crashed DeepCAM on an H100), for every
workload's model and on every device present; the gaps stay zero and out of the optimizers' maths."""
from __future__ import annotations

import pytest
import torch

from hpcbench.common.flat import ALIGN_ELEMS, FlatParams
from hpcbench.common.optim import DistributedLAMB, build_optimizer
from hpcbench.common.precision import module_to_channels_last
from hpcbench.common.runconfig import OptimConfig
from hpcbench import registry

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["cosmoflow", "deepcam", "oc20"])
def test_every_view_of_every_workload_model_is_256_byte_aligned(name: str, device: str) -> None:
    cls = registry.get(name)
    model = cls(cls.load_config("mini")).build_model().to(device)
    if name != "oc20":
        model = module_to_channels_last(model)
    flat = FlatParams(model)
    assert flat.params.data_ptr() % 256 == 0 and flat.grads.data_ptr() % 256 == 0
    for p in flat:
        assert p.data_ptr() % 256 == 0 and p.grad.data_ptr() % 256 == 0
        assert (p.data_ptr() - flat.params.data_ptr()) // 4 % ALIGN_ELEMS == 0
    assert int(flat.lengths.sum()) == flat.size
    assert torch.equal(flat.flatten([p.detach().clone() for p in flat]), flat.params)
    packed = flat.pack(flat.params)
    assert packed.numel() == flat.numel == sum(p.numel() for p in model.parameters() if p.requires_grad)
    again = torch.zeros_like(flat.params)
    flat.unpack(packed, again)
    assert torch.equal(again, flat.params)


def _gap_mask(flat: FlatParams) -> torch.Tensor:
    mask = torch.ones(flat.size, dtype=torch.bool)
    for off, n in zip(flat.offsets, flat.numels):
        mask[off : off + n] = False
    return mask


@pytest.mark.parametrize("opt", ["sgd", "adamw", "lamb", "distributed_lamb"])
def test_alignment_gaps_stay_zero_through_training_steps(opt: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 3))  # 35, 7, 21, 3: unaligned sizes
    flat = FlatParams(model)
    assert flat.offsets == [0, 64, 128, 192] and flat.size == 256
    cfg = OptimConfig(name="lamb" if opt == "distributed_lamb" else opt, lr=0.1, weight_decay=0.01,  # type: ignore[arg-type]
                      distributed=opt == "distributed_lamb")
    optimizer = build_optimizer(flat, cfg)
    assert isinstance(optimizer, DistributedLAMB) == (opt == "distributed_lamb")
    before = flat.pack(flat.params).clone()
    for _ in range(3):
        flat.zero_grad()
        model(torch.randn(4, 5)).square().sum().backward()
        flat.check_grads()
        optimizer.step(torch.tensor(0.1))
    mask = _gap_mask(flat)
    assert flat.params[mask].abs().sum() == 0 and flat.grads[mask].abs().sum() == 0
    assert not torch.equal(flat.pack(flat.params), before)  # the real parameters moved


def test_distributed_lamb_shards_real_elements_not_gaps() -> None:
    """The shard split is over the packed parameters: ceil(numel / world) each, whatever the gaps."""
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 3))  # numel 66, buffer 256
    flat = FlatParams(model)
    for world in (1, 2, 3, 4, 7):
        sizes = [int(flat.shard_lengths(r, world).sum()) for r in range(world)]
        assert sizes == [-(-66 // world)] * world
        real = [int(flat.shard_lengths(r, world)[:-1].sum()) for r in range(world)]
        assert sum(real) == 66
