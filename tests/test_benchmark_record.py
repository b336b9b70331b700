"""The benchmark records (hpcbench.common.benchmark) against the installed mlperf_logging, the registry's
light import, the closed target taken from the record, and the MLPerf keys built by common/mlperf_keys.py
against what each workload logged before the builder existed."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from hpcbench import registry
from hpcbench.common.errors import ConfigError
from hpcbench.common.workload import DataSizes

ROOT = Path(__file__).resolve().parents[1]
BOUND = re.compile(r"v\['value'\]\s*(<=|>=|<|>)\s*([0-9.]+)")


def _checker_bounds(check: str) -> tuple[tuple[float, bool], tuple[float, bool]]:
    """((low, inclusive), (high, inclusive)) of an ATLEAST_ONE_CHECK; a missing bound is -inf/inf."""
    bounds = BOUND.findall(check)
    low = next(((float(v), op == ">=") for op, v in bounds if op.startswith(">")), (float("-inf"), True))
    high = next(((float(v), op == "<=") for op, v in bounds if op.startswith("<")), (float("inf"), True))
    return low, high


@pytest.mark.parametrize("name", registry.names())
def test_record_matches_the_installed_checker_and_benchmark_meta(name: str) -> None:
    from mlperf_logging import compliance_checker
    from mlperf_logging.benchmark_meta import get_result_file_counts

    r = registry.entry(name)
    assert r.name == name and registry.record_of(r.benchmark) is r
    assert registry.get(name).record is r  # the class declares nothing of its own
    base = Path(compliance_checker.__file__).parent / f"{r.suite}_{r.ruleset}"
    for division in ("closed", "open"):
        rules = yaml.safe_load((base / f"{division}_{r.benchmark}.yaml").read_text())
        (rule,) = [x["KEY"] for x in rules if x.get("KEY", {}).get("NAME") == r.metric_key
                   and "ATLEAST_ONE_CHECK" in x["KEY"]]
        t = r.target_in(division)
        assert ((t.low, t.low_inclusive), (t.high, t.high_inclusive)) == _checker_bounds(rule["ATLEAST_ONE_CHECK"]), \
            (name, division, rule["ATLEAST_ONE_CHECK"])
    assert get_result_file_counts(r.suite)[r.benchmark] == r.required_runs == registry.required_runs(r.benchmark)
    assert registry.suite_of(r.benchmark) == (r.suite, r.ruleset)


def test_rule_facts_without_a_workload() -> None:
    from mlperf_logging.benchmark_meta import get_result_file_counts

    # every benchmark of the hpc suite has its workload now: nothing left to state without one
    assert not set(get_result_file_counts("hpc")) & set(registry.unimplemented_benchmarks())
    assert registry.required_runs("openfold") == get_result_file_counts("hpc")["openfold"] == 10
    assert registry.record_of("openfold") is not None and registry.suite_of("openfold") == ("hpc", "3.0.0")
    assert registry.epoch_reporting("openfold") == "samples"
    assert (registry.epoch_reporting("bert"), registry.epoch_reporting("dlrm_dcnv2")) == ("samples", "fraction")
    assert (registry.max_dropped_runs("unet3d"), registry.max_dropped_runs("resnet")) == (4, 1)


def test_common_names_no_benchmark() -> None:
    """Benchmark names live in the records, not in common/ (docstrings aside: code only)."""
    import ast

    names = {registry.entry(n).benchmark for n in registry.names()} | set(registry.names())
    for path in (ROOT / "common").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
                raise AssertionError(f"{path.relative_to(ROOT)}:{node.lineno} names the benchmark {node.value!r}")


def test_registry_imports_no_torch() -> None:
    code = ("import sys\nfrom hpcbench import registry\nfrom hpcbench.report import targets\n"
            "[registry.required_runs(b) for b in ('cosmoflow', 'unet3d', 'openfold')]\n"
            "registry.layout('cosmoflow'); registry.layout('oc20'); registry.layout('resnet')\n"
            "registry.suite_of('bert'); targets.target_for('deepcam', 'open')\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'torch_geometric', 'nvidia')"
            " or m.endswith(('.workload', '.model'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_datagen_reads_its_options_and_checks_them_without_torch() -> None:
    """``hpcbench datagen NAME`` and ``hpcbench run``'s datagen step take the options and the embedded dataset
    from the record's light ``datagen`` part: no torch and no model code (torch costs a 2-core box ~2.5 s of
    CPU per process); a bad option is refused there, before anything is written."""
    code = ("import sys\nfrom hpcbench import registry\nfrom hpcbench.commands.datagen import workload_parser\n"
            "bad = []\n"
            "for name in registry.names():\n"
            "    ns = workload_parser(name).parse_args(['--out', '/nonexistent/x', *registry.datagen(name).embedded_datagen_args()])\n"
            "    mods = [m for m in sys.modules if m.split('.')[0] in ('torch', 'torch_geometric') or m.endswith(('.workload', '.model'))]\n"
            "    if mods: bad.append((name, mods[:3])); break\n"
            "print(bad)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


@pytest.mark.parametrize("name", registry.names())
def test_the_workload_class_writes_data_through_its_datagen_part(name: str) -> None:
    """The workload class derives from its light part (one home for the options and the writer), and an
    out-of-tree workload (``package.module:Class``, no record part: the harness tests' toy) is its own datagen."""
    part, cls = registry.datagen(name), registry.get(name)
    assert registry.entry(name).datagen and issubclass(cls, part) and part is not cls
    assert cls.embedded_datagen_args() == part.embedded_datagen_args()
    assert cls.datagen.__func__ is part.datagen.__func__ and cls.add_datagen_args.__func__ is part.add_datagen_args.__func__
    toy = "tests.harness_toy:ToyWorkload"
    assert registry.datagen(toy) is registry.get(toy)


@pytest.mark.parametrize("name", registry.names())
def test_full_preset_takes_the_closed_target_from_the_record(name: str) -> None:
    cls = registry.get(name)
    r = cls.record
    full = cls.load_config("full")
    assert full.train.division == "closed" and full.train.target == r.target.threshold
    assert "target" not in tomllib.loads((cls.presets_dir() / "full.toml").read_text())["train"]
    assert cls.load_config("full", [f"train.target={r.target.threshold}"]).train.target == r.target.threshold
    with pytest.raises(ConfigError, match="train.target"):
        cls.load_config("full", [f"train.target={r.target.threshold / 2}"])
    mini = cls.load_config("mini")  # open: its own target
    assert mini.train.division == "open" and mini.train.target is not None
    assert cls.load_config("mini", ["train.target=none"]).train.target == r.target.threshold


@pytest.mark.parametrize("name,optimizer", [("bert", "adam"), ("dlrm_dcnv2", "sgd"), ("unet3d", "lamb"),
                                            ("resnet", "lamb"), ("oc20", "sgd"), ("deepcam", "adagrad")])
def test_an_optimizer_the_keys_cannot_describe_is_refused_naming_the_key(name: str, optimizer: str) -> None:
    cls = registry.get(name)
    with pytest.raises(ConfigError, match="config key 'optim.name'"):
        cls.load_config("mini", [f"optim.name={optimizer}"])


def test_out_of_tree_workload_declares_its_own_record() -> None:
    cls = registry.get("tests.harness_toy:ToyWorkload")
    assert (cls.name, cls.benchmark, cls.suite, cls.ruleset, cls.metric_key) == \
        ("toy", "cosmoflow", "hpc", "3.0.0", "eval_error")
    from tests.harness_toy import ToyBert

    assert (ToyBert.record.epoch_reporting, ToyBert.ruleset, ToyBert.suite) == ("samples", "5.0.0", "training")


# --- the MLPerf keys -------------------------------------------------------------------------------------

#: overrides of each preset checked besides the preset itself (other optimizers and schedules)
VARIANTS = {
    "deepcam": [[], ["optim.schedule=multistep"],
                ["optim.unit=epochs", "optim.warmup=2", "optim.schedule=multistep", "optim.milestones=[3]"]],
    "unet3d": [[], ["optim.schedule=multistep", "optim.milestones=[300]"]],
    "resnet": [[], ["optim.name=sgd", "optim.lr=2.048"]],
    "bert": [[], ["optim.warmup=0.5"]],
    "dlrm_dcnv2": [[], ["optim.warmup=0.5"]],
}


def _logged(cls: type, preset: str, overrides: list[str], steps_per_epoch: int) -> list[list[object]]:
    cfg = cls.load_config(preset, overrides)
    wl = cls(cfg)
    wl.sizes = DataSizes(train_samples=steps_per_epoch * cfg.train.global_batch_size, eval_samples=10,
                         steps_per_epoch=steps_per_epoch, local_batch_size=4)
    return [list(kv) for kv in wl.hyperparameters().items()]


#: values changed on purpose since tests/data/hyperparameters_before.json was written, per "<name>|<preset>":
#: CosmoFlow logs its epochs as integers (the HPC rules: "list of positive integers"; the reference logs
#: 4 and [32, 64]) and its decay factors as the list of absolute factors of the peak that ran (the
#: reference's {32: 0.25, 64: 0.125}; mini's one factor is the same rate as its former 0.25); docs/closed.md
CHANGED = {
    "cosmoflow|mini": {"opt_learning_rate_warmup_epochs": 1, "opt_learning_rate_decay_boundary_epochs": [5],
                       "opt_learning_rate_decay_factor": [0.25]},
    "cosmoflow|full": {"opt_learning_rate_warmup_epochs": 4, "opt_learning_rate_decay_boundary_epochs": [32, 64],
                       "opt_learning_rate_decay_factor": [0.25, 0.125]},
    # DeepCAM's reference cosine anneals over t_max steps after its warmup, and logs that t_max
    # (utils/schedulers.py, optimizer_helpers.py): the mini's cosine (20 warmup steps) logs the run's steps - 20
    # ("<name>|<preset>|<variant>|<steps per epoch>": a value that depends on the steps per epoch)
    "deepcam|mini||7": {"scheduler_t_max": 64},
    "deepcam|mini||390": {"scheduler_t_max": 4660},
}

#: keys added on purpose since then, per workload: (the key logged before it, the new key, its value), where that
#: key is logged and the new one was not already: CosmoFlow's momentum also under the HPC rules' table name
#: sgd_opt_momentum (docs/closed.md); BERT's epsilon also as opt_epsilon (the rules' table; NVIDIA logs both);
#: ResNet's model_bn_span with LARS too (the reference logs it whatever the optimizer; 4 = the local batch here)
ADDED = {"cosmoflow": [("opt_momentum", "sgd_opt_momentum", 0.9)],
         "bert": [("opt_lamb_epsilon", "opt_epsilon", 1e-06)],
         "resnet": [("lars_opt_learning_rate_warmup_epochs", "model_bn_span", 4)]}


def test_keys_equal_what_each_workload_logged_before_the_builder() -> None:
    """tests/data/hyperparameters_before.json: every workload's hyperparameters() (keys, order, values and
    their JSON types) for its mini and full presets and the VARIANTS, written by the hand-written
    hyperparameters() of commit 13fcaf9, before common/mlperf_keys.py built them; CHANGED and ADDED: since then."""
    expected = json.loads((ROOT / "tests" / "data" / "hyperparameters_before.json").read_text())
    for key, items in expected.items():
        changed = {**CHANGED.get("|".join(key.split("|")[:2]), {}), **CHANGED.get(key, {})}
        expected[key] = [[k, changed.get(k, v)] for k, v in items]
        for after, new, value in ADDED.get(key.split("|")[0], []):
            names = [k for k, _ in expected[key]]
            if after in names and new not in names:
                expected[key].insert(names.index(after) + 1, [new, value])
    seen = {}
    before = {k.split("|")[0] for k in expected}
    for name in registry.names():
        if name not in before:  # registered after the builder (llama31_8b): nothing hand-written to compare with
            continue
        cls = registry.get(name)
        for preset in ("mini", "full"):
            for over in VARIANTS.get(name, [[]]):
                for spe in (7, 390):
                    seen[f"{name}|{preset}|{' '.join(over)}|{spe}"] = _logged(cls, preset, over, spe)
    assert seen.keys() == expected.keys()
    for key, items in seen.items():
        assert json.dumps(items, default=str) == json.dumps(expected[key]), key


def test_workloads_add_only_keys_no_other_workload_has() -> None:
    from hpcbench.common.mlperf_keys import data_keys, optimizer_keys

    own: dict[str, set[str]] = {}
    for name in registry.names():
        cls = registry.get(name)
        cfg = cls.load_config("full")
        wl = cls(cfg)
        wl.sizes = DataSizes(train_samples=4000, eval_samples=10, steps_per_epoch=100, local_batch_size=4)
        built = {**optimizer_keys(cls.record, cfg.optim, 100, cfg.train.max_epochs),
                 **data_keys(wl.max_sequence_length())}
        hp = wl.hyperparameters()
        assert {k: hp[k] for k in built} == built
        own[name] = set(hp) - set(built)
    for name, keys in own.items():
        others = set().union(*(v for n, v in own.items() if n != name))
        assert not keys & others, (name, keys & others)
        assert not any(k.startswith(("opt_", "lars_", "sgd_", "scheduler_")) for k in keys), (name, keys)
