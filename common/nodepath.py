"""The ``{node}`` placeholder of node-local paths (``hpcbench stage --dest``, ``hpcbench train --stage-to``,
``data.root``): one rule, applied here only.

``{node}`` is replaced by the node index (a format spec works too: ``{node:03d}``); ``{{`` and ``}}`` stand
for a literal brace. Any other placeholder (``{nodes}``, ``{0}``, ``{}``) or an unmatched brace is a
:class:`ConfigError` that names the option the path came from.
"""
from __future__ import annotations

import string

from .errors import ConfigError

PLACEHOLDER = "node"


def node_path(template: str, node: int, option: str) -> str:
    """``template`` with ``{node}`` replaced by ``node``; ``option`` (``--dest``, ``data.root``) names the
    source of ``template`` in the error a bad placeholder raises."""
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
        bad = [f for f in fields if f != PLACEHOLDER]
        if bad:
            raise ValueError(f"unknown placeholder {{{bad[0]}}}")
        return template.format(node=node)
    except ValueError as exc:  # an unmatched brace, an unknown placeholder, a bad format spec
        raise ConfigError(f"{option} {template!r}: only the {{node}} placeholder is allowed ({exc}; write "
                          "{{ and }} for a literal brace)") from None


def has_node(template: str) -> bool:
    """Whether ``template`` holds a ``{node}`` placeholder (``{{node}}`` is a literal, not one)."""
    try:
        return any(f == PLACEHOLDER for _, f, _, _ in string.Formatter().parse(template))
    except ValueError:
        return False
