"""Learning-rate schedules computed on the device from a step-counter tensor (no host sync).

``lr(step)`` with ``step`` the 0-based optimizer step as a float tensor, all lengths converted to
steps once at build time (``unit = "epochs"`` multiplies by the steps per epoch):

* warmup over ``W`` steps (``W > 0``), ending at the peak ``lr`` (but ``zero_start``, below): with ``warmup_factor = 1``
  the rate rises linearly from ``lr/W`` (``lr * (step + 1) / W``); with ``f = warmup_factor > 1`` it
  rises linearly from ``lr / f`` (the MLPerf "scale the base rate up by f" style); with ``f < 1`` it
  rises linearly from ``lr * f``;
* ``warmup_style = "nemo"``: ``lr * (step + 1) / (W + 1)`` while ``step < W``, so the peak comes at step
  ``W`` (NeMo's ``WarmupAnnealHoldPolicy``, which ``CosineAnnealing`` and the Llama 3.1 8B reference use);
* ``warmup_style = "linspace"``: the ``W`` rates ``torch.linspace(warmup_start_lr, lr, W)``, i.e.
  ``start + (lr - start) * step / (W - 1)`` (``start`` alone when ``W = 1``), so step ``W - 1`` already has
  the peak (the OpenFold reference's ``OpenFoldBenchmarkLRScheduler``, called with the 1-based iteration);
* ``warmup_style = "zero_start"``: ``lr * (step - S) / W`` while ``step - S < W``, ``S = warmup_start``
  (in ``unit``, may be negative), so the warmup starts from rate 0 at step ``S`` and the rate after it is
  the schedule's own at the global ``step``, not shifted by ``S`` (TF BERT's ``create_optimizer``, the
  MLPerf BERT reference's warmup and ``start_warmup_step``: with ``S < 0`` the run starts part-way up the
  ramp; a ``step < S`` has the formula's negative rate, as there);
* ``constant``: ``lr`` after warmup;
* ``multistep``: ``lr * decay_factor ** (number of milestones <= step)``; with ``decay_factors``
  (one per milestone) the factors are absolute, not multiplied together: ``lr * decay_factors[i]``
  after milestone ``i`` (the reference CosmoFlow's ``decay_schedule = {32: 0.25, 64: 0.125}``);
* ``lr_per_epoch`` (constant and multistep, unit epochs): the rate is set once at the start of each
  epoch from its 0-based index ``e``, as the reference CosmoFlow's Keras ``LearningRateScheduler``
  calls its ``_lr_schedule(epoch)``: ``start + e * (lr - start) / W`` while ``e < W`` (``W`` warmup
  epochs, ``start = lr / warmup_factor`` as above, so ``warmup_factor = 1`` starts at ``lr``), then
  ``lr`` x the factor of the last milestone ``m < e`` (strictly less: the reference's test, so
  milestone 32 first applies in the epoch of index 33, logged ``epoch_num`` 34); with
  ``warmup_first_epoch = 1`` the warmup counts epochs from 1 and with ``warmup_start_lr`` it starts from
  that absolute rate: ``start + (e + 1) * (lr - start) / W`` while ``e < W``, the reference 3D U-Net's
  ``lr_warmup(init_learning_rate, lr, epoch, W)`` called at the start of each 1-based epoch ``e + 1 <= W``;
* ``cosine``: ``min_lr + (lr - min_lr) * (1 + cos(pi * (step - W) / (T - W))) / 2``, held at
  ``min_lr`` after ``T`` (``total``, or the run's length when 0; an explicit ``total`` must exceed
  the warmup's end, ``S + W`` with ``zero_start``; a run shorter than its warmup just ends at ``min_lr``);
* ``poly``: ``min_lr + (lr - min_lr) * (1 - min(step, T) / T) ** power`` (``T`` as for cosine),
  counted from step 0, not from the end of warmup: the reference BERT's ``polynomial_decay`` of the
  global step, which warmup overrides while it lasts (MLPerf BERT: power 1; the RCP at batch 256 has no
  warmup, those from 3,072 up warm up with ``zero_start``);
* ``poly`` with ``poly_from_warmup``: the MLPerf ResNet schedule (NVIDIA's ``PolySchedule``; the
  reference TF2 ``PolynomialDecayWithWarmup`` is the same up to one step): with the 1-based iteration
  ``i = step + 1``, ``lr * i / W`` while ``i <= W`` (the warmup above), then
  ``min_lr + (lr - min_lr) * (1 - (i - W) / (T - W)) ** power``, reaching ``min_lr`` (MLPerf's
  ``end_learning_rate``, 1e-4) at the last step ``i = T``; :attr:`Schedule.decay_steps` is ``T - W``
  (the logged ``lars_opt_learning_rate_decay_steps``).

``schedule_semantics = "held_warmup"`` (multistep or cosine, whole steps) replaces the warmup and decay rules above
with the per-step rates of the MLPerf HPC DeepCAM reference (``utils/schedulers.py``'s ``MultiStepLRWarmup`` and
``CosineAnnealingLRWarmup``, which ``train.py`` builds with ``last_epoch = 0`` and its trainer steps after every
optimizer step, so step ``s`` runs at the scheduler's ``e = s + 1``), with ``lr`` the reference's ``start_lr``:

* warmup ``W > 0``: ``lr * e / W`` (``f = warmup_factor = 1``) or ``lr * ((f - 1) * e / W + 1)`` while
  ``e < W``; from ``e = W`` on the decay starts from the warmup's last rate ``H`` (that at ``e = W - 1``; ``lr``
  when ``W = 1``), not from ``lr``: with ``W = 400`` steps 0..398 rise to ``lr * 399 / 400``, which holds;
* multistep: ``H * decay_factor ** (number of milestones m with s >= m + W)``: the reference shifts each
  milestone to ``m + W + 1`` in ``e`` (milestone 800, warmup 400: the first decayed step is 1200);
  without warmup (``torch.optim.lr_scheduler.MultiStepLR`` with ``last_epoch = 0``) ``m <= s + 1``;
* cosine with ``t = e - W`` and ``T_max = total - W`` (``total`` as above; the logged ``scheduler_t_max``):
  ``min_lr + (H - min_lr) * (1 + cos(pi * t / T_max)) / 2`` for ``t <= T_max`` (``min_lr`` at step
  ``total - 1``), then the same with ``lr`` for ``H``: torch's cosine annealing goes on periodically, back up
  to ``lr``; without warmup (``CosineAnnealingLR``, built with ``last_epoch = -1``) ``t = s`` with ``lr``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .errors import ConfigError
from .runconfig import OptimConfig


@dataclass(frozen=True)
class Schedule:
    kind: str
    lr: float
    warmup_steps: float
    warmup_factor: float
    milestones: tuple[float, ...]
    decay_factor: float
    min_lr: float
    total_steps: float
    power: float = 1.0
    poly_from_warmup: bool = False
    decay_factors: tuple[float, ...] = ()  # multistep: absolute factors of lr, one per milestone
    lr_per_epoch: bool = False
    steps_per_epoch: float = 1.0
    warmup_start_lr: float = 0.0  # lr_per_epoch: an absolute start rate (0: from warmup_factor)
    warmup_first_epoch: int = 0  # lr_per_epoch: 1 counts the first epoch as 1 (the U-Net reference)
    warmup_style: str = "harness"  # per step: harness | nemo | linspace | zero_start (module doc)
    warmup_start: float = 0.0  # zero_start: the step S the warmup counts from (module doc)
    semantics: str = "harness"  # harness | held_warmup (the DeepCAM reference's scheduler; module doc)

    @classmethod
    def from_config(cls, cfg: OptimConfig, steps_per_epoch: int, max_epochs: int) -> "Schedule":
        scale = float(steps_per_epoch) if cfg.unit == "epochs" else 1.0
        total = cfg.total * scale if cfg.total > 0 else float(max_epochs * steps_per_epoch)
        if cfg.poly_from_warmup and cfg.schedule != "poly":
            raise ConfigError(f"config key 'optim.poly_from_warmup': applies to the poly schedule only, got schedule "
                              f"{cfg.schedule!r}")
        if not float(cfg.warmup_start * scale).is_integer():
            raise ConfigError(f"config key 'optim.warmup_start': the warmup's start step (the reference's integer "
                              f"start_warmup_step) must be a whole step, got {cfg.warmup_start:g} {cfg.unit} = "
                              f"{cfg.warmup_start * scale:g} steps")
        warmup_end = (cfg.warmup + (cfg.warmup_start if cfg.warmup > 0 else 0.0)) * scale  # first step past it
        if cfg.schedule in ("cosine", "poly") and cfg.total > 0 and total <= warmup_end:
            raise ConfigError(
                f"config key 'optim.total': the {cfg.schedule} length ({total:g} steps) must exceed the warmup "
                f"(to step {warmup_end:g})"
            )
        if cfg.schedule_semantics == "held_warmup":
            cls._check_held_warmup(cfg, scale, total)
        return cls(
            kind=cfg.schedule,
            lr=cfg.lr,
            warmup_steps=cfg.warmup * scale,
            warmup_factor=cfg.warmup_factor,
            milestones=tuple(m * scale for m in cfg.milestones),
            decay_factor=cfg.decay_factor,
            min_lr=cfg.min_lr,
            total_steps=total,
            power=cfg.power,
            poly_from_warmup=cfg.poly_from_warmup,
            decay_factors=tuple(cfg.decay_factors),
            lr_per_epoch=cfg.lr_per_epoch,
            steps_per_epoch=float(max(1, steps_per_epoch)),
            warmup_start_lr=cfg.warmup_start_lr,
            warmup_first_epoch=cfg.warmup_first_epoch,
            warmup_style=cfg.warmup_style,
            warmup_start=cfg.warmup_start * scale,
            semantics=cfg.schedule_semantics,
        )

    @staticmethod
    def _check_held_warmup(cfg: OptimConfig, scale: float, total: float) -> None:
        """The DeepCAM reference's scheduler counts whole steps: its warmup, milestones and cosine length."""
        if cfg.schedule not in ("multistep", "cosine"):
            raise ConfigError(f"config key 'optim.schedule_semantics': 'held_warmup' has the multistep and cosine "
                              f"schedules only, got {cfg.schedule!r}")
        for key, steps in (("warmup", [cfg.warmup * scale]), ("milestones", [m * scale for m in cfg.milestones])):
            if any(not float(v).is_integer() for v in steps):
                raise ConfigError(f"config key 'optim.{key}': the 'held_warmup' schedule semantics count whole steps, "
                                  f"got {steps}")
        # an explicit total only: a run shorter than its warmup (total 0) never reaches the cosine
        if cfg.schedule == "cosine" and cfg.total > 0 and (not float(total).is_integer()
                                                           or total - cfg.warmup * scale < 1):
            raise ConfigError(f"config key 'optim.total': the 'held_warmup' cosine spans T_max = total - warmup >= 1 "
                              f"whole steps, got total {total:g} and warmup {cfg.warmup * scale:g} steps")

    @property
    def decay_steps(self) -> float:
        """Steps the decay spans: ``T - W`` for ``poly_from_warmup`` and ``cosine``, else ``T``."""
        if self.kind == "cosine" or self.poly_from_warmup:
            return max(self.total_steps - self.warmup_steps, 1.0)
        return self.total_steps

    def __call__(self, step: torch.Tensor) -> torch.Tensor:
        """The learning rate at ``step`` (a float tensor), as a tensor on the same device."""
        if self.lr_per_epoch:
            return self._per_epoch(step)
        if self.semantics == "held_warmup":
            return self._held_warmup(step)
        base = self._after_warmup(step)
        if self.warmup_steps <= 0:
            return base
        w = self.warmup_steps
        f = self.warmup_factor
        if self.warmup_style == "zero_start":
            counted = step - self.warmup_start
            return torch.where(counted < w, self.lr * counted / w, base)
        if self.warmup_style == "nemo":
            warm = self.lr * (step + 1.0) / (w + 1.0)
        elif self.warmup_style == "linspace":
            start = self.warmup_start_lr
            warm = start + (self.lr - start) * (step / (w - 1.0) if w > 1.0 else torch.zeros_like(step))
        elif f != 1.0:
            start = self._start()
            warm = start + (self.lr - start) * torch.clamp(step / w, max=1.0)
        else:
            warm = self.lr * torch.clamp((step + 1.0) / w, max=1.0)
        return torch.where(step < w, warm, base)

    def _held_warm(self, e: float | torch.Tensor) -> float | torch.Tensor:
        """The reference warmup's rate at its scheduler count ``e`` (``e < W``)."""
        f = self.warmup_factor
        if f == 1.0:
            return self.lr * e / self.warmup_steps
        return self.lr * ((f - 1.0) * e / self.warmup_steps + 1.0)

    def _held_warmup(self, step: torch.Tensor) -> torch.Tensor:
        """``schedule_semantics = "held_warmup"`` (module doc); scalar comparisons only, as in :meth:`_multistep`."""
        w = self.warmup_steps
        e = step + 1.0  # the reference scheduler's last_epoch while the optimizer takes step `step`
        # the rate the decay starts from: the warmup's last (the optimizer's own lr when W = 1), or lr without one
        held = float(self._held_warm(w - 1.0)) if w >= 2.0 else self.lr
        if self.kind == "multistep":
            # MultiStepLR tests its count for equality from 1 on: a milestone 0 without warmup never applies
            edges = [m + w for m in self.milestones] if w > 0 else [m - 1.0 for m in self.milestones if m >= 1]
            passed = sum((step >= m).to(step.dtype) for m in edges) if edges else torch.zeros_like(step)
            after = held * torch.pow(torch.full_like(step, self.decay_factor), passed)
        else:  # cosine annealing T_max steps past the warmup, then on periodically from the base lr
            t_max = self.decay_steps
            t = e - w if w > 0 else step
            amplitude = torch.where(t <= t_max, torch.full_like(step, held), torch.full_like(step, self.lr))
            after = self.min_lr + (amplitude - self.min_lr) * 0.5 * (1.0 + torch.cos(math.pi * t / t_max))
        if w <= 0:
            return after
        return torch.where(e < w, self._held_warm(e), after)

    def _start(self) -> float:
        """The rate warmup starts from: ``warmup_start_lr`` where set, else from ``warmup_factor``."""
        if self.warmup_start_lr:
            return self.warmup_start_lr
        f = self.warmup_factor
        return self.lr / f if f >= 1.0 else self.lr * f

    def _per_epoch(self, step: torch.Tensor) -> torch.Tensor:
        """``lr_per_epoch``: the rate of the epoch holding ``step``, from the step where that epoch starts."""
        first = torch.floor(step / self.steps_per_epoch) * self.steps_per_epoch  # e x steps per epoch
        if self.kind == "multistep":
            base = self._multistep(first, strict=True)
        else:
            base = torch.full_like(step, self.lr)
        if self.warmup_steps <= 0:
            return base
        start = self._start()
        counted = first + self.warmup_first_epoch * self.steps_per_epoch  # e (or e + 1) x steps per epoch
        warm = start + (self.lr - start) * counted / self.warmup_steps
        return torch.where(first < self.warmup_steps, warm, base)

    def _multistep(self, step: torch.Tensor, strict: bool = False) -> torch.Tensor:
        if not self.milestones:
            return torch.full_like(step, self.lr)
        # scalar comparisons: no host-to-device copy, so this is legal inside CUDA-graph capture
        passed = [(step > m if strict else step >= m).to(step.dtype) for m in self.milestones]
        if self.decay_factors:  # absolute: 1 + sum of the steps between consecutive factors (milestones sorted)
            factor = torch.ones_like(step)
            previous = 1.0
            for p, f in zip(passed, self.decay_factors):
                factor = factor + p * (f - previous)
                previous = f
            return self.lr * factor
        return self.lr * torch.pow(torch.full_like(step, self.decay_factor), sum(passed))

    def _after_warmup(self, step: torch.Tensor) -> torch.Tensor:
        if self.kind == "constant":
            return torch.full_like(step, self.lr)
        if self.kind == "multistep":
            return self._multistep(step)
        if self.kind == "cosine":
            span = max(self.total_steps - self.warmup_steps, 1.0)  # a run shorter than its warmup
            t = torch.clamp((step - self.warmup_steps) / span, 0.0, 1.0)
            return self.min_lr + (self.lr - self.min_lr) * 0.5 * (1.0 + torch.cos(math.pi * t))
        if self.kind == "poly":
            if self.poly_from_warmup:  # 1-based iterations past the warmup over the steps after it
                t = torch.clamp((step + 1.0 - self.warmup_steps) / self.decay_steps, 0.0, 1.0)
            else:
                t = torch.clamp(step / max(self.total_steps, 1.0), 0.0, 1.0)
            return self.min_lr + (self.lr - self.min_lr) * torch.pow(1.0 - t, self.power)
        raise ConfigError(f"config key 'optim.schedule': unknown schedule {self.kind!r}")

    def value(self, step: int) -> float:
        """Host-side convenience (tests, logs): the rate at an integer step."""
        return float(self(torch.tensor(float(step), dtype=torch.float64)))
