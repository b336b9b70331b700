"""Typed model configuration: the module sizes of the reference's ``AlphaFoldConfig`` (MLPerf HPC openfold,
``openfold/config.py``) and the loss weights of its ``initial_training`` stage.

:meth:`ModelConfig.closed` is the closed-division model (93,229,082 parameters, the count that
``closed_openfold.yaml`` pins); :meth:`ModelConfig.mini` shrinks blocks and channels for CPU runs.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional


@dataclass(frozen=True)
class EvoformerConfig:
    """The Evoformer stack (and, with ``c_m`` = c_e and global column attention, the extra-MSA stack)."""
    c_m: int = 256
    c_z: int = 128
    c_hidden_msa_att: int = 32
    c_hidden_opm: int = 32
    c_hidden_tri_mul: int = 128
    c_hidden_tri_att: int = 32
    c_s: int = 384
    num_heads_msa: int = 8
    num_heads_tri: int = 4
    num_blocks: int = 48
    transition_n: int = 4
    msa_dropout: float = 0.15
    pair_dropout: float = 0.25
    inf: float = 1e9
    eps: float = 1e-8  # global column attention (extra-MSA stack)
    eps_opm: float = 1e-3
    chunk_size_msa_att: Optional[int] = None
    chunk_size_opm: Optional[int] = None
    chunk_size_tri_att: Optional[int] = None


@dataclass(frozen=True)
class TemplateConfig:
    enabled: bool = True
    embed_torsion_angles: bool = True
    ta_dim: int = 57  # template_angle_feat: 22 aatype + 14 sin/cos + 14 alt sin/cos + 7 mask
    tp_dim: int = 88  # template_pair_feat: 39 distogram + 1 mask + 2 x 22 aatype + 3 unit vector + 1 mask
    c_t: int = 64
    c_hidden_tri_att: int = 16
    c_hidden_tri_mul: int = 64
    num_blocks: int = 2
    num_heads_tri: int = 4
    pair_transition_n: int = 2
    dropout_rate: float = 0.25
    inf: float = 1e9
    chunk_size_tri_att: Optional[int] = None
    c_hidden_pointwise: int = 16
    num_heads_pointwise: int = 4
    inf_pointwise: float = 1e5
    chunk_size_pointwise: Optional[int] = None
    distogram_min_bin: float = 3.25
    distogram_max_bin: float = 50.75
    distogram_num_bins: int = 39
    use_unit_vector: bool = False
    pair_feat_inf: float = 1e5
    pair_feat_eps: float = 1e-6


@dataclass(frozen=True)
class StructureConfig:
    c_s: int = 384
    c_z: int = 128
    c_hidden_ipa: int = 16
    c_hidden_ang_res: int = 128
    num_heads_ipa: int = 12
    num_qk_points: int = 4
    num_v_points: int = 8
    dropout_rate: float = 0.1
    num_blocks: int = 8
    num_ang_res_blocks: int = 2
    num_angles: int = 7
    scale_factor: float = 10.0
    inf: float = 1e5
    eps: float = 1e-8


@dataclass(frozen=True)
class HeadsConfig:
    c_hidden_plddt: int = 128
    plddt_bins: int = 50
    distogram_bins: int = 64
    masked_msa_classes: int = 23
    experimentally_resolved_classes: int = 37
    tm_enabled: bool = False
    tm_bins: int = 64
    tm_max_bin: int = 31


@dataclass(frozen=True)
class LossConfig:
    """Weights and constants of the reference's ``LossConfig`` (initial training stage)."""
    fape_weight: float = 1.0
    fape_backbone_weight: float = 0.5
    fape_sidechain_weight: float = 0.5
    fape_backbone_clamp: float = 10.0
    fape_backbone_unit: float = 10.0
    fape_sidechain_clamp: float = 10.0
    fape_sidechain_unit: float = 10.0
    fape_eps: float = 1e-4
    chi_weight: float = 1.0
    chi_chi_weight: float = 0.5
    chi_angle_norm_weight: float = 0.01
    chi_eps: float = 1e-8
    distogram_weight: float = 0.3
    distogram_min_bin: float = 2.3125
    distogram_max_bin: float = 21.6875
    distogram_bins: int = 64
    distogram_eps: float = 1e-8
    masked_msa_weight: float = 2.0
    masked_msa_eps: float = 1e-8
    plddt_weight: float = 0.01
    plddt_cutoff: float = 15.0
    plddt_min_resolution: float = 0.1
    plddt_max_resolution: float = 3.0
    plddt_bins: int = 50
    plddt_eps: float = 1e-8
    # experimentally-resolved (0.0), violation (0.0) and TM (disabled) are off in initial training: the
    # closed config does not enable them, so they are not computed.
    experimentally_resolved_weight: float = 0.0
    violation_weight: float = 0.0


@dataclass(frozen=True)
class ModelConfig:
    tf_dim: int = 22
    msa_dim: int = 49
    emsa_dim: int = 25
    c_m: int = 256
    c_z: int = 128
    c_e: int = 64
    c_s: int = 384
    relpos_k: int = 32
    recycle_min_bin: float = 3.25
    recycle_max_bin: float = 20.75
    recycle_num_bins: int = 15
    recycle_inf: float = 1e8
    # recompute the stacks' blocks in the backward pass instead of keeping their activations (the reference
    # trains so; a model of a few channels has activations too small to be worth the recomputation)
    activation_checkpointing: bool = True
    template: TemplateConfig = field(default_factory=TemplateConfig)
    extra_msa: EvoformerConfig = field(default_factory=lambda: EvoformerConfig(
        c_m=64, c_hidden_msa_att=8, num_blocks=4))
    evoformer: EvoformerConfig = field(default_factory=EvoformerConfig)
    structure: StructureConfig = field(default_factory=StructureConfig)
    heads: HeadsConfig = field(default_factory=HeadsConfig)
    loss: LossConfig = field(default_factory=LossConfig)

    @classmethod
    def closed(cls) -> "ModelConfig":
        """The reference's model for ``initial_training`` (what the closed division trains)."""
        return cls()

    @classmethod
    def mini(cls, c_m: int = 32, c_z: int = 16, c_s: int = 32, evoformer_blocks: int = 2,
             extra_blocks: int = 1, structure_blocks: int = 2) -> "ModelConfig":
        """A few blocks with small channels: forward+backward in well under a second on a CPU at crop ~40."""
        c_e = max(8, c_m // 4)
        return cls(
            c_m=c_m, c_z=c_z, c_e=c_e, c_s=c_s,
            template=TemplateConfig(c_t=8, c_hidden_tri_att=4, c_hidden_tri_mul=8, num_blocks=1,
                                    num_heads_tri=2, c_hidden_pointwise=4, num_heads_pointwise=2),
            extra_msa=EvoformerConfig(c_m=c_e, c_z=c_z, c_hidden_msa_att=4, c_hidden_opm=4,
                                      c_hidden_tri_mul=c_z, c_hidden_tri_att=4, c_s=c_s, num_heads_msa=2,
                                      num_heads_tri=2, num_blocks=extra_blocks, transition_n=2),
            evoformer=EvoformerConfig(c_m=c_m, c_z=c_z, c_hidden_msa_att=8, c_hidden_opm=8,
                                      c_hidden_tri_mul=c_z, c_hidden_tri_att=8, c_s=c_s, num_heads_msa=4,
                                      num_heads_tri=2, num_blocks=evoformer_blocks, transition_n=2),
            structure=StructureConfig(c_s=c_s, c_z=c_z, c_hidden_ipa=8, c_hidden_ang_res=32,
                                      num_heads_ipa=4, num_qk_points=4, num_v_points=4,
                                      num_blocks=structure_blocks),
            heads=HeadsConfig(c_hidden_plddt=32),
        )

    def with_chunks(self, chunk_size: Optional[int]) -> "ModelConfig":
        """The same model with chunked attention / outer product mean (inference-sized inputs)."""
        ev = replace(self.evoformer, chunk_size_msa_att=chunk_size, chunk_size_opm=chunk_size,
                     chunk_size_tri_att=chunk_size)
        ex = replace(self.extra_msa, chunk_size_msa_att=chunk_size, chunk_size_opm=chunk_size,
                     chunk_size_tri_att=chunk_size)
        tp = replace(self.template, chunk_size_tri_att=chunk_size, chunk_size_pointwise=chunk_size)
        return replace(self, evoformer=ev, extra_msa=ex, template=tp)
