"""Run an installed closed YAML's CHECK (and POST) expressions on the values a preset logs, as the official
compliance checker evaluates them; the quality-target key is left to the caller."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def check_closed_yaml(ruleset: str, name: str, logged: dict[str, Any], skip: str = "eval_accuracy") -> list[str]:
    """Assert every CHECK of ``compliance_checker/<ruleset>/<name>`` on ``logged``; return the keys checked."""
    from mlperf_logging import compliance_checker

    rules = yaml.safe_load((Path(compliance_checker.__file__).parent / ruleset / name).read_text())
    state: dict = {}
    checked = []
    for rule in rules:
        key = rule.get("KEY")
        if not key or key["NAME"] == skip:
            continue
        key_name = key["NAME"]
        assert key_name in logged, f"{key_name} is not logged"
        v = {"value": logged[key_name], "metadata": {}}
        checks = key.get("CHECK", [])
        for check in [checks] if isinstance(checks, str) else checks:
            assert eval(check, {}, {"v": v, "s": state}), (key_name, check, logged[key_name])  # noqa: S307 - the checker's own
        if "POST" in key:
            exec(key["POST"], {}, {"v": v, "s": state})  # noqa: S102
        checked.append(key_name)
    return checked
