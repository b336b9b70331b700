"""The ``{node}`` placeholder of node-local paths has one home (hpcbench.common.nodepath): `stage --dest`,
`train --stage-to` and ``data.root`` all go through it, and a bad placeholder names the option it came from."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from hpcbench.common.errors import ConfigError
from hpcbench.common.nodepath import has_node, node_path
from tests.conftest import run_cli


def test_node_is_replaced_everywhere_and_a_path_without_it_is_unchanged() -> None:
    assert node_path("/tmp/st/node{node}", 3, "--dest") == "/tmp/st/node3"
    assert node_path("/l/{node}/x{node}", 0, "--dest") == "/l/0/x0"
    assert node_path("/l/n{node:03d}", 7, "--dest") == "/l/n007"
    assert node_path("/scratch/data", 5, "data.root") == "/scratch/data"
    assert node_path("/a/{{node}}", 1, "--dest") == "/a/{node}"  # doubled braces: a literal
    assert has_node("/x/node{node}") and has_node("/x/{node:02d}")
    assert not has_node("/x/node") and not has_node("/x/{{node}}") and not has_node("/x/{node")


@pytest.mark.parametrize("template, why", [
    ("/tmp/st/node{nodes}", "unknown placeholder {nodes}"),
    ("/tmp/st/{0}", "unknown placeholder {0}"),
    ("/tmp/st/{}", "unknown placeholder {}"),
    ("/tmp/st/{node.real}", "unknown placeholder {node.real}"),
    ("/tmp/st/node{node", "expected '}'"),
    ("/tmp/st/node}", "Single '}'"),
    ("/tmp/st/{node:q}", "Unknown format code"),
])
def test_a_bad_placeholder_is_an_error_naming_the_option(template: str, why: str) -> None:
    for option in ("--dest", "--stage-to", "data.root"):
        with pytest.raises(ConfigError) as err:
            node_path(template, 1, option)
        msg = str(err.value)
        assert msg.startswith(f"{option} {template!r}: only the {{node}} placeholder is allowed (")
        assert why in msg


def test_stage_dest_uses_it() -> None:
    from hpcbench.staging.stage import node_dest

    one_node = SimpleNamespace(layout=SimpleNamespace(num_nodes=1, host_local_size=1, local_size=1))
    assert node_dest("/tmp/st/node{node}", 2, one_node) == Path("/tmp/st/node2")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^--dest '/tmp/st/\{nodes\}': only the \{node\} placeholder"):
        node_dest("/tmp/st/{nodes}", 2, one_node)  # type: ignore[arg-type]
    emulated = SimpleNamespace(layout=SimpleNamespace(num_nodes=2, host_local_size=2, local_size=1))
    with pytest.raises(ConfigError, match="several emulated nodes share this host"):
        node_dest("/tmp/st/{{node}}", 0, emulated)  # type: ignore[arg-type]


def test_require_staged_uses_it() -> None:
    from hpcbench.staging.marker import require_staged

    data = SimpleNamespace(root="/nowhere/{nodes}", node_local=True, require_staged=True)
    rank = SimpleNamespace(node_index=0, instance_node_index=0, nodes_per_instance=1)
    with pytest.raises(ConfigError, match=r"^data.root '/nowhere/\{nodes\}': only the \{node\} placeholder"):
        require_staged(data, rank, "cosmoflow")


TOY = ["train", "tests.harness_toy:ToyWorkload", "--config", "tests/harness_configs/mini.toml", "--no-progress"]


def test_train_names_stage_to_for_a_bad_placeholder_before_staging(tmp_path: Path) -> None:
    proc = run_cli([*TOY, "--results", str(tmp_path / "sub"), "--stage-from", str(tmp_path / "packed"),
                    "--stage-to", str(tmp_path / "local" / "node{nodes}")], timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"--stage-to '{tmp_path}/local/node{{nodes}}': only the {{node}} placeholder" in proc.stderr
    assert not (tmp_path / "local").exists()


def test_train_names_data_root_for_a_bad_placeholder(tmp_path: Path) -> None:
    proc = run_cli([*TOY, "--results", str(tmp_path / "sub"), "--data", str(tmp_path / "d{nodes}")], timeout=120)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert f"data.root '{tmp_path}/d{{nodes}}': only the {{node}} placeholder" in proc.stderr
