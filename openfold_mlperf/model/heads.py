"""Auxiliary heads (supplement 1.9): per-residue lDDT-Ca (pLDDT), distogram, masked MSA, experimentally
resolved, and the TM-score head when the configuration enables it (it does not in the closed setup)."""
from __future__ import annotations

import torch
import torch.nn as nn

from .config import HeadsConfig
from .primitives import LayerNorm, Linear


class PerResidueLDDTCaPredictor(nn.Module):
    def __init__(self, c_s: int, c_hidden: int, num_bins: int) -> None:
        super().__init__()
        self.layer_norm = LayerNorm(c_s)
        self.linear_1 = Linear(c_s, c_hidden, init="relu")
        self.linear_2 = Linear(c_hidden, c_hidden, init="relu")
        self.linear_3 = Linear(c_hidden, num_bins, init="final")

    def forward(self, s: torch.Tensor) -> torch.Tensor:
        return self.linear_3(torch.relu(self.linear_2(torch.relu(self.linear_1(self.layer_norm(s))))))


class _LinearHead(nn.Module):
    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.linear = Linear(c_in, c_out, init="final")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


class DistogramHead(_LinearHead):
    def forward(self, z: torch.Tensor) -> torch.Tensor:
        logits = self.linear(z.float() if z.dtype == torch.float16 else z)
        return logits + logits.transpose(-2, -3)  # symmetric


def compute_plddt(logits: torch.Tensor) -> torch.Tensor:
    """Expected lDDT-Ca in percent from the binned logits (bin centres (i + 0.5) / num_bins)."""
    n = logits.shape[-1]
    centres = (torch.arange(n, device=logits.device, dtype=torch.float32) + 0.5) / n
    return torch.sum(torch.softmax(logits.float(), dim=-1) * centres, dim=-1) * 100.0


class AuxiliaryHeads(nn.Module):
    def __init__(self, cfg: HeadsConfig, c_s: int, c_z: int, c_m: int) -> None:
        super().__init__()
        self.plddt = PerResidueLDDTCaPredictor(c_s, cfg.c_hidden_plddt, cfg.plddt_bins)
        self.distogram = DistogramHead(c_z, cfg.distogram_bins)
        self.masked_msa = _LinearHead(c_m, cfg.masked_msa_classes)
        self.experimentally_resolved = _LinearHead(c_s, cfg.experimentally_resolved_classes)
        self.tm_enabled = cfg.tm_enabled
        if cfg.tm_enabled:
            self.tm = _LinearHead(c_z, cfg.tm_bins)

    def forward(self, outputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        aux = {"lddt_logits": self.plddt(outputs["sm_single"])}
        aux["plddt"] = compute_plddt(aux["lddt_logits"])
        aux["distogram_logits"] = self.distogram(outputs["pair"])
        aux["masked_msa_logits"] = self.masked_msa(outputs["msa"])
        aux["experimentally_resolved_logits"] = self.experimentally_resolved(outputs["single"])
        if self.tm_enabled:
            aux["tm_logits"] = self.tm(outputs["pair"])
        return aux
