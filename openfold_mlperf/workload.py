"""OpenFold on the harness: the reference's samplers and features (``spec.py``), its model started from the
pinned checkpoint, its loss, lDDT-Ca on the CAMEO targets with the averaged ("SWA") weights, and the keys of
``closed_openfold.yaml``."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcbench.common.errors import ConfigError
from hpcbench.common.workload import DataShard, EpochLoader, Workload

from . import BENCHMARK
from .config import OpenFoldConfig
from .datagen import OpenFoldDatagen
from .spec import EpochLoader as WeightedEpochs
from .spec import OpenFoldData, RecyclingDraws, TrainChains

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from torch import nn

Batch = dict[str, "torch.Tensor"]


class OpenFoldWorkload(OpenFoldDatagen, Workload[OpenFoldConfig]):
    record = BENCHMARK
    config_cls = OpenFoldConfig

    def __init__(self, cfg: OpenFoldConfig) -> None:
        super().__init__(cfg)  # the record's keys describe Adam only: another optim.name is refused there
        self._spec = OpenFoldData(cfg.data, cfg.train.seed)
        self._init_sha256 = ""  # of the initial checkpoint, once loaded
        self._init_optimizer: dict[str, Any] | None = None  # its Adam state (torch's layout), if any
        self._param_names: list[str] = []  # the model's parameters in torch's order (the state's indices)
        self._param_shapes: dict[str, tuple[int, ...]] = {}
        self._parameters = 0

    # data ---------------------------------------------------------------------------------
    def dataset(self) -> OpenFoldData:
        return self._spec

    def train_loader(self, shard: DataShard) -> EpochLoader:
        loader = super().train_loader(shard)
        source = self.source(self._spec.train_split)
        assert isinstance(source, TrainChains)
        source.seed = shard.seed  # the instance's seed: every rank draws the same epoch, then takes its part
        d = self.cfg.data
        draws = RecyclingDraws(shard.seed, d.num_recycling_iters) if d.random_recycling else None
        return WeightedEpochs(loader, source, draws)

    def batch_size(self, batch: Batch) -> int:
        return int(batch["aatype"].shape[0])

    # model and maths ----------------------------------------------------------------------
    def model_config(self) -> Any:
        from .model.config import ModelConfig

        m = self.cfg.model
        mc = ModelConfig.closed() if m.preset == "closed" else ModelConfig.mini(
            c_m=m.c_m, c_z=m.c_z, c_s=m.c_s, evoformer_blocks=m.evoformer_blocks, extra_blocks=m.extra_blocks,
            structure_blocks=m.structure_blocks)
        if not m.dropout:
            mc = replace(mc, evoformer=replace(mc.evoformer, msa_dropout=0.0, pair_dropout=0.0),
                         extra_msa=replace(mc.extra_msa, msa_dropout=0.0, pair_dropout=0.0),
                         template=replace(mc.template, dropout_rate=0.0),
                         structure=replace(mc.structure, dropout_rate=0.0))
        if not m.activation_checkpointing:
            mc = replace(mc, activation_checkpointing=False)
        return mc.with_chunks(m.chunk_size) if m.chunk_size else mc

    def init_checkpoint_path(self) -> Path | None:
        path = self.cfg.model.init_checkpoint
        if not path:
            return None
        p = Path(path)
        return p if p.is_absolute() else self.data_root() / p

    def build_model(self) -> "nn.Module":
        from .model.alphafold import AlphaFold
        from .model.checkpoint import CheckpointError, load_initial_checkpoint

        model = AlphaFold(self.model_config())
        meta = any(p.is_meta for p in model.parameters())  # built to count parameters: no weights to load into
        path = None if meta else self.init_checkpoint_path()
        if path is not None:
            try:
                loaded = load_initial_checkpoint(path, model, self.cfg.model.init_checkpoint_sha256 or None)
            except CheckpointError as e:
                raise ConfigError(f"config key 'model.init_checkpoint': {e}") from None
            self._init_sha256 = loaded.sha256
            if self.cfg.model.init_optimizer_state and loaded.optimizer_state_dict:
                self._init_optimizer = loaded.optimizer_state_dict
        self._param_names = [n for n, _ in model.named_parameters()]
        self._param_shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
        self._parameters = sum(p.numel() for p in model.parameters())
        return model

    def initial_optimizer_state(self, names: list[str]) -> dict[str, Any] | None:
        """The initial checkpoint's Adam moments and step (torch's ``optimizer.state_dict()``: one group over
        ``model.parameters()``, state by index), per parameter of ``names``; None without them."""
        import torch

        state = self._init_optimizer
        if state is None:
            return None
        where = f"config key 'model.init_checkpoint' ({self.init_checkpoint_path()}): optimizer_state_dict"
        groups, per = state.get("param_groups"), state.get("state")
        ids = [i for g in groups for i in g.get("params", [])] if isinstance(groups, list) else []
        if not isinstance(per, dict) or len(ids) != len(self._param_names):
            raise ConfigError(f"{where}: expected one Adam group over the model's {len(self._param_names)} "
                              f"parameters, got {len(ids)}")
        by_name = {n: per.get(i, per.get(str(i))) for n, i in zip(self._param_names, ids)}
        out: dict[str, Any] = {"exp_avg": [], "exp_avg_sq": []}
        steps = set()
        for name in names:
            st = by_name.get(name)
            if st is None:  # never had a gradient (a head whose loss weight is 0): torch's Adam keeps no state
                for k in out:
                    out[k].append(torch.zeros(self._param_shapes[name]))
                continue
            if not isinstance(st, dict) or not all(isinstance(st.get(k), torch.Tensor) for k in out):
                raise ConfigError(f"{where}: no exp_avg/exp_avg_sq for {name}")
            for k in out:
                out[k].append(st[k])
            steps.add(float(st.get("step", 0)))
        if len(steps) != 1:
            raise ConfigError(f"{where}: the parameters' Adam steps differ ({sorted(steps)[:3]})")
        out["step"] = steps.pop() if steps else 0.0
        return out

    def forward(self, model: "nn.Module", batch: Batch) -> Any:
        return model(batch)

    def loss(self, outputs: Any, batch: Batch) -> "torch.Tensor":
        """The reference's ``AlphaFoldLoss`` per sample (weighted terms x sqrt(crop length)), summed over this
        rank's samples (the harness divides by the instance's sample count: the reference's mean over ranks)."""
        from .model.losses import alphafold_loss

        last = {k: v[..., -1] for k, v in batch.items()}
        mean, _ = alphafold_loss(outputs, last, self.model_config().loss)
        return mean * last["aatype"].shape[0]

    def loss_count(self, batch: Batch) -> "torch.Tensor":
        import torch

        aatype = batch["aatype"]
        return torch.full((), float(aatype.shape[0]), dtype=torch.float32, device=aatype.device)

    def eval_sums(self, outputs: Any, batch: Batch) -> Mapping[str, "torch.Tensor"]:
        """Per sample the reference's validation metric, lDDT-Ca of the final atom positions (eps 1e-8, over
        the chain), summed, and the number of samples."""
        from .model.losses import lddt_ca

        score = lddt_ca(outputs["final_atom_positions"].float(), batch["all_atom_positions"][..., -1],
                        batch["all_atom_mask"][..., -1], eps=1e-8, per_residue=False)
        return {"lddt_ca": score.sum(), "samples": score.new_full((), float(score.shape[0]))}

    def metric(self, sums: Mapping[str, float]) -> float:
        """The average lDDT-Ca over the validation targets (``avg_lddt_ca``)."""
        return float(sums["lddt_ca"]) / max(1.0, float(sums["samples"]))

    def val_every_iters(self) -> int:
        """Training iterations between evaluations: from ``train.eval_every_samples``, or (0 there, open division)
        from the epoch cadence ``train.eval_every`` once the steps per epoch are known (0 before)."""
        tc = self.cfg.train
        if tc.eval_every_samples:
            return tc.eval_every_samples // tc.global_batch_size
        steps = self.sizes.steps_per_epoch if self.sizes is not None else 0
        return int(tc.eval_every * steps)

    def hyperparameters(self) -> dict[str, Any]:
        d, m, t = self.cfg.data, self.model_config(), self.cfg.model
        loss = m.loss
        sha = self._init_sha256 or t.init_checkpoint_sha256
        return {
            **super().hyperparameters(),
            "target_avg_lddt_ca_value": self.target().threshold,
            "precision": self.cfg.train.precision,  # the reference logs its --precision (fp32 or tf32)
            "train_max_pdb_release_date": d.train_max_pdb_release_date,
            "val_min_cameo_submission_date": d.val_min_cameo_submission_date,
            "val_max_cameo_submission_date": d.val_max_cameo_submission_date,
            "val_max_sequence_length": d.val_max_sequence_length,
            "val_every_iters": self.val_every_iters(),
            "model_parameters_count": self._parameters or _count(m),
            "init_checkpoint_sha256sum": sha or "none (seeded random initialisation)",
            "train_sequence_crop_size": d.crop_size,
            "num_recycling_iters": d.num_recycling_iters,
            "max_msa_clusters": d.max_msa_clusters,
            "max_extra_msa": d.max_extra_msa,
            "templates_enabled": m.template.enabled,
            "max_templates": d.max_templates,
            "fape_loss_weight": loss.fape_weight,
            "fape_loss_backbone_weight": loss.fape_backbone_weight,
            "fape_loss_sidechain_weight": loss.fape_sidechain_weight,
            "supervised_chi_loss_weight": loss.chi_weight,
            "distogram_loss_weight": loss.distogram_weight,
            "masked_msa_loss_weight": loss.masked_msa_weight,
            "plddt_loss_weight": loss.plddt_weight,
            "initial_training_dataloader_type": d.loader_type,
        }


def _count(cfg: Any) -> int:
    """Parameters of the model ``cfg`` builds, on the meta device (nothing allocated)."""
    import torch

    from .model.alphafold import AlphaFold

    with torch.device("meta"):
        return sum(p.numel() for p in AlphaFold(cfg).parameters())
