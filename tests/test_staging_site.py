"""`hpcbench stage --dataset D` and `hpcbench train W --stage` with the site's entries (hpcbench.site): the
packed source from `[data] D`, the node-local dest `<[paths] stage_dir>/D`, `--ranks-per-node` from an
emulating site; the site chosen by `--system`/`--site` or $HPCBENCH_SYSTEM (which rendered jobs export);
explicit paths win; a missing site or key names the file and the keys to add."""
from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.synth_data import write_cosmoflow
from hpcbench import registry
from hpcbench.common.errors import ConfigError
from hpcbench.site import ENV, Options, resolve
from hpcbench.staging.marker import check_staged
from hpcbench.staging.pack import Packer
from tests.conftest import project_env, run_cli, run_mpi

MiB = 1 << 20
OPTS = Options("stage --dataset cosmoflow", "--source", "--dest", "--system", "pass them")


def site_file(path: Path, packed: Path | None, stage_dir: str | None, emulate: bool = True) -> Path:
    lines = ["[data]"] + ([f'cosmoflow = "{packed}"'] if packed else []) + ["[paths]"]
    lines += [f'stage_dir = "{stage_dir}"'] if stage_dir is not None else []
    lines += ["[node]", f"emulate_nodes = {'true' if emulate else 'false'}", "tasks_per_node = 1"]
    path.write_text("\n".join(lines) + "\n")
    return path


def env_without_site(**extra: str) -> dict[str, str]:
    env = project_env(**extra)
    if ENV not in extra:
        env.pop(ENV, None)
    return env


def test_mpirun_stage_dataset_uses_the_site(tmp_path: Path) -> None:
    """`mpiexec -n 4 python -m hpcbench stage --dataset cosmoflow`: no paths, no --ranks-per-node; the site
    (selected by $HPCBENCH_SYSTEM) emulates 4 nodes and stages every file, byte for byte."""
    raw, packed = tmp_path / "raw", tmp_path / "packed"
    write_cosmoflow(raw, 8, 4, size=8)
    Packer(raw, packed, registry.layout("cosmoflow"), 12000, threads=2, progress=False).run()
    site = site_file(tmp_path / "site.toml", packed, f"{tmp_path}/local/node{{node}}")
    proc = run_mpi(4, ["-m", "hpcbench", "stage", "--dataset", "cosmoflow", "--instances", "2", "--timeout", "60"],
                   timeout=180, env=env_without_site(**{ENV: str(site)}))
    assert "staging report" in proc.stdout
    src = {p.relative_to(raw).as_posix(): p.read_bytes() for p in raw.rglob("*") if p.is_file()}
    for inst in (0, 1):  # 4 emulated nodes = 2 instances of 2 nodes, each instance holds the whole dataset
        union: dict[str, bytes] = {}
        for node in (2 * inst, 2 * inst + 1):
            folder = tmp_path / "local" / f"node{node}" / "cosmoflow"
            marker = check_staged(folder, "cosmoflow")
            assert marker["layout"]["nodes_per_instance"] == 2
            got = {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*")
                   if p.is_file() and ".hpcbench" not in p.parts}
            assert not set(union) & set(got)
            union.update(got)
        assert union == src


def test_stage_without_a_site_names_the_keys_to_add(tmp_path: Path) -> None:
    proc = run_cli(["stage", "--dataset", "cosmoflow"], env=env_without_site())
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    err = proc.stderr
    assert "--source and --dest not given and no site settings" in err
    assert f"--system NAME|FILE or set {ENV}=NAME|FILE" in err
    assert '[data] cosmoflow = "/shared/cosmoflow-packed"' in err and "[paths] stage_dir =" in err
    # the old answer is gone
    assert "stage needs --source and --dest" not in err


def test_stage_with_a_site_lacking_the_entry_names_file_and_key(tmp_path: Path) -> None:
    site = site_file(tmp_path / "site.toml", None, None)
    proc = run_cli(["stage", "--dataset", "cosmoflow"], env=env_without_site(**{ENV: str(site)}))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"site settings {site} (from {ENV}) has no staging entry for cosmoflow" in proc.stderr
    assert "add [data] cosmoflow = " in proc.stderr and "add [paths] stage_dir = " in proc.stderr
    proc = run_cli(["stage", "--dataset", "cosmoflow", "--system", str(tmp_path / "nosuch.toml")],
                   env=env_without_site())
    assert proc.returncode == 2 and f"--system {tmp_path}/nosuch.toml: system settings" in proc.stderr
    assert "not found" in proc.stderr


def test_resolve_rules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    site = site_file(tmp_path / "s.toml", tmp_path / "packed", "/tmp/x/node{node}/")
    got = resolve("cosmoflow", None, None, str(site), OPTS)
    assert (got.source, got.dest, got.ranks_per_node, got.site) == (str(tmp_path / "packed"),
                                                                      "/tmp/x/node{node}/cosmoflow", 1, site)
    # explicit paths win; with both given and no --system, $HPCBENCH_SYSTEM is not even read
    got = resolve("cosmoflow", "/src", None, str(site), OPTS)
    assert (got.source, got.dest) == ("/src", "/tmp/x/node{node}/cosmoflow")
    monkeypatch.setenv(ENV, str(tmp_path / "missing.toml"))
    got = resolve("cosmoflow", "/src", "/dst", None, OPTS)
    assert (got.source, got.dest, got.ranks_per_node, got.site) == ("/src", "/dst", None, None)
    with pytest.raises(ConfigError, match=f"{ENV} .*missing.toml: system settings .* not found"):
        resolve("cosmoflow", "/src", None, None, OPTS)
    # real nodes: no {node} needed and no --ranks-per-node default; emulated: {node} required
    real = site_file(tmp_path / "real.toml", tmp_path / "packed", "/local_nvme/stage", emulate=False)
    got = resolve("cosmoflow", None, None, str(real), OPTS)
    assert (got.dest, got.ranks_per_node) == ("/local_nvme/stage/cosmoflow", None)
    emu = site_file(tmp_path / "emu.toml", tmp_path / "packed", "/tmp/stage")
    with pytest.raises(ConfigError, match=r"\[paths\] stage_dir = '/tmp/stage' must hold a \{node\} placeholder"):
        resolve("cosmoflow", None, None, str(emu), OPTS)
    with pytest.raises(ConfigError, match="pass them"):
        resolve(None, None, "/dst", str(site), OPTS)


def test_stage_copy_method_needs_the_raw_source(tmp_path: Path) -> None:
    site = site_file(tmp_path / "site.toml", tmp_path / "packed", f"{tmp_path}/local/node{{node}}")
    proc = run_cli(["stage", "--dataset", "cosmoflow", "--method", "copy"], env=env_without_site(**{ENV: str(site)}))
    assert proc.returncode == 2 and "--method copy reads the raw dataset: pass --source RAW" in proc.stderr


def test_train_stage_takes_the_site_entries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`train cosmoflow --stage` (and --stage-from/--stage-to without values) resolve to the same paths as
    `stage --dataset cosmoflow`; explicit values win; the emulating site sets --ranks-per-node."""
    from hpcbench.cli import build_parser
    from hpcbench.commands.train import _site_staging

    site = site_file(tmp_path / "site.toml", tmp_path / "packed", "/tmp/l/node{node}")
    parser = build_parser()

    def staged(*argv: str) -> tuple[str, str, int | None]:
        args = parser.parse_args(["train", "cosmoflow", *argv])
        _site_staging(args)
        return args.stage_from, args.stage_to, args.ranks_per_node

    monkeypatch.setenv(ENV, str(site))
    want = (str(tmp_path / "packed"), "/tmp/l/node{node}/cosmoflow", 1)
    assert staged("--stage") == want
    assert staged("--stage-from", "--stage-to") == want
    assert staged("--stage-to", "/mine/node{node}") == (want[0], "/mine/node{node}", 1)
    assert staged("--stage", "--ranks-per-node", "2") == (*want[:2], 2)
    assert staged() == (None, None, None)  # no staging asked for: the site is not read
    assert staged("--stage-from", "/p", "--stage-to", "/l") == ("/p", "/l", None)
    monkeypatch.delenv(ENV)
    assert staged("--stage", "--site", str(site)) == want
    with pytest.raises(ConfigError, match=r"train cosmoflow --stage: --stage-from and --stage-to not given .*\[data\] "
                                          "cosmoflow"):
        staged("--stage")


def test_rendered_jobs_export_the_site_and_use_the_same_dest(tmp_path: Path) -> None:
    from hpcbench.jobs import JOBS_DIR, JobSpec, render

    script = render(JobSpec(system="gpu-cluster", workload="cosmoflow", instances=2))
    assert f"export {ENV}={JOBS_DIR / 'systems' / 'gpu-cluster.toml'}" in script
    assert "--stage-to /local_nvme/hpcbench/stage/cosmoflow" in script
    own = tmp_path / "mysite.toml"
    own.write_text((JOBS_DIR / "systems" / "local.toml").read_text().replace('oc20 = ""', 'oc20 = "/p/oc20"'))
    script = render(JobSpec(system=str(own), workload="opencatalyst", mode="strong"))
    assert f"export {ENV}={own.resolve()}" in script
    assert "--stage-from /p/oc20 --stage-to '/tmp/hpcbench-stage/node{node}/oc20'" in script
