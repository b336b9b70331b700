"""The harness and a model built on the meta device (common/build.py): only a workload that shards its parameters
may return one, and its distribute() must leave no parameter there; both refusals name the workload and the cause."""
from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest
import torch
from torch import nn

from hpcbench.common.dist import init_distributed
from hpcbench.common.errors import ConfigError
from hpcbench.common.mllog import MLPerfLogger
from hpcbench.common.system import SystemDescription
from hpcbench.common.trainer import Trainer
from tests.harness_toy import ToyWorkload


class MetaToy(ToyWorkload):
    def build_model(self) -> nn.Module:
        with torch.device("meta"):
            return super().build_model()


class ShardingMetaToy(MetaToy):
    shards_parameters: ClassVar[bool] = True  # but its distribute() (the default) gives the model no storage


@pytest.mark.parametrize("cls, expected", [
    (MetaToy, r"workload toy: build_model\(\) returned parameters on the meta device, which only a workload that "
              r"shards its parameters"),
    (ShardingMetaToy, r"workload toy: distribute\(\) left 8 parameters on the meta device \(first: 0.weight\)"),
])
def test_a_meta_model_is_refused_unless_distribute_materialises_it(tmp_path: Path, cls: type, expected: str) -> None:
    env = init_distributed(device="cpu")
    try:
        tr = Trainer(cls(cls.load_config("mini")), env, MLPerfLogger(tmp_path / "log.txt"), SystemDescription())
        with pytest.raises(ConfigError, match=expected):
            tr.run()
        tr.log.close()
    finally:
        env.close()
