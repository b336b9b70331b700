"""Config system: strict TOML presets, typed --set overrides, dump round trip."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from hpcbench.common.config import dumps_toml, flatten, load_config, set_override
from hpcbench.common.errors import ConfigError
from hpcbench.common.runconfig import RunConfig


@dataclass
class DataSection:
    root: str = ""
    size: int = 32
    shuffle: bool = True


@dataclass
class ModelSection:
    channels: tuple[int, ...] = (8, 16)
    act: Literal["relu", "leaky_relu"] = "leaky_relu"
    dropout: float = 0.5
    width: int | None = None


@dataclass
class ToyConfig(RunConfig):
    data: DataSection = field(default_factory=DataSection)
    model: ModelSection = field(default_factory=ModelSection)


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "cfg.toml"
    p.write_text(text)
    return p


def test_defaults_preset_and_overrides_apply_in_order(tmp_path: Path) -> None:
    p = write(tmp_path, '[data]\nsize = 64\n[optim]\nname = "lamb"\nlr = 0.5\n[model]\nchannels = [4, 8, 16]\n')
    cfg = load_config(ToyConfig, p, ["optim.lr=0.25", "data.root=/scratch/x", "model.width=3"])
    assert cfg.data.size == 64
    assert cfg.optim.name == "lamb"
    assert cfg.optim.lr == 0.25
    assert cfg.data.root == "/scratch/x"
    assert cfg.model.channels == (4, 8, 16)
    assert cfg.model.width == 3
    assert cfg.data.shuffle is True  # untouched default


def test_presets_resolve_by_name(tmp_path: Path) -> None:
    (tmp_path / "mini.toml").write_text("[train]\nmax_epochs = 3\n")
    cfg = load_config(ToyConfig, "mini", presets_dir=tmp_path)
    assert cfg.train.max_epochs == 3
    with pytest.raises(ConfigError, match=r"no preset named 'huge'.*presets: mini"):
        load_config(ToyConfig, "huge", presets_dir=tmp_path)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("optim.lrr=1", r"unknown config key 'optim.lrr' \(did you mean 'optim.lr'\?\); allowed keys in optim: name, lr"),
        ("optim.lr=fast", r"config key 'optim.lr': expected a number, got 'fast'"),
        ("train.max_epochs=2.5", r"config key 'train.max_epochs': expected an integer, got 2.5"),
        ("train.precision=fp8", r"config key 'train.precision': 'fp8' is not allowed; expected one of 'auto', 'fp32', 'bf16', 'fp16'"),
        ("data.shuffle=1", r"config key 'data.shuffle': expected true or false, got 1"),
        ("model.channels=[1, 'a']", r"config key 'model.channels\[1\]': expected an integer, got 'a'"),
        ("nosuch.key=1", r"unknown config key 'nosuch'; allowed keys in the top level: optim, train, data, model"),
        ("optim.lr", r"expected KEY=VALUE"),
        ("optim.lr.x=1", r"config key 'optim.lr' is a value, not a section"),
        ("train.global_batch_size=0", r"config key 'train.global_batch_size': must be >= 1, got 0"),
        # non-finite numbers, integers beyond 64 bits, values outside their range (hostile-input audit)
        ("optim.lr=nan", r"config key 'optim.lr': expected a finite number, got nan"),
        ("optim.lr=inf", r"config key 'optim.lr': expected a finite number, got inf"),
        ("train.target=nan", r"config key 'train.target': expected a finite number, got nan"),
        ("model.dropout=-inf", r"config key 'model.dropout': expected a finite number"),
        ("train.seed=1e30", r"config key 'train.seed': 1000000000000000019884624838656 does not fit a 64-bit integer"),
        ("train.seed=-1", r"config key 'train.seed': must be in \[0, 2147483647\]"),
        ("train.seed=4294967296", r"config key 'train.seed': must be in \[0, 2147483647\]"),
        ("optim.warmup=-3", r"config key 'optim.warmup': must be >= 0, got -3.0"),
        ("optim.warmup_factor=-1", r"config key 'optim.warmup_factor': must be >= 0, got -1.0"),
        ("optim.lr=" + "9" * 400, r"config key 'optim.lr': 9+ is beyond the float range"),
        ("optim.momentum=-1", r"config key 'optim.momentum': must be in \[0, 1\), got -1.0"),
        ("optim.momentum=5", r"config key 'optim.momentum': must be in \[0, 1\), got 5.0"),
        ("optim.weight_decay=-1", r"config key 'optim.weight_decay': must be >= 0"),
        ("optim.betas=[1.5, 0.9]", r"config key 'optim.betas': each must be in \[0, 1\), got \[1.5, 0.9\]"),
        ("optim.betas=[nan, 0.9]", r"config key 'optim.betas\[0\]': expected a finite number, got nan"),
        ("optim.eps=-1", r"config key 'optim.eps': must be >= 0"),
        ("optim.total=-5", r"config key 'optim.total': must be >= 0"),
        ("optim.power=-2", r"config key 'optim.power': must be > 0"),
        ("optim.min_lr=-1", r"config key 'optim.min_lr': must be >= 0"),
        ("optim.max_grad_norm=nan", r"config key 'optim.max_grad_norm': expected a finite number"),
    ],
)
def test_bad_overrides_name_the_key(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(ToyConfig, None, [override])


def test_a_decay_floor_above_the_rate_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"config key 'optim.min_lr': the cosine schedule decays from optim.lr "
                                          r"\(0.004\) down to it; got 1, above it"):
        load_config(ToyConfig, None, ["optim.schedule=cosine", "optim.lr=0.004", "optim.min_lr=1.0"])
    assert load_config(ToyConfig, None, ["optim.schedule=multistep", "optim.lr=0.004", "optim.min_lr=1.0"])


def test_bad_preset_file_names_file_and_key(tmp_path: Path) -> None:
    p = write(tmp_path, "[data]\nsise = 3\n")
    with pytest.raises(ConfigError, match=r"cfg.toml: unknown config key 'data.sise' \(did you mean 'data.size'\?\)"):
        load_config(ToyConfig, p)
    bad = write(tmp_path, "[data\nsize=")
    with pytest.raises(ConfigError, match=r"cfg.toml is not valid TOML"):
        load_config(ToyConfig, bad)
    with pytest.raises(ConfigError, match=r"does not exist"):
        load_config(ToyConfig, tmp_path / "missing.toml")


def test_string_keys_keep_numeric_looking_text() -> None:
    cfg = load_config(ToyConfig, None, ["data.root=2024"])
    assert cfg.data.root == "2024"


def test_dump_round_trips(tmp_path: Path) -> None:
    cfg = load_config(ToyConfig, None, ["optim.milestones=[10, 20]", "model.channels=[3]", "optim.betas=[0.8, 0.9]"])
    p = write(tmp_path, dumps_toml(cfg))
    again = load_config(ToyConfig, p)
    assert again == cfg
    flat = flatten(cfg)
    assert flat["optim.milestones"] == [10.0, 20.0]
    assert flat["model.act"] == "leaky_relu"
    assert "model.width" not in flat  # None values are omitted from dumps


def test_set_override_on_nested_instance() -> None:
    cfg = ToyConfig()
    set_override(cfg, "optim.betas=[0.5, 0.6]")
    assert cfg.optim.betas == (0.5, 0.6)
