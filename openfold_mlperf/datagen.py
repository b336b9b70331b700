"""``hpcbench datagen openfold``: the synthetic mmCIF/A3M/HHR chains in the reference's processed layout, and the
mini preset's initial checkpoint (the pinned one, or pretrained / fine-tuned for other data). Imports no model
code: only a pretraining imports torch and the workload class."""
from __future__ import annotations

import argparse
from pathlib import Path

from hpcbench import registry
from hpcbench.common.data.datagen import Datagen
from hpcbench.common.errors import ConfigError

from .pinned import MINI as PINNED
from .pretrain import MINI_CHECKPOINT, StartGate

#: how ``hpcbench run``'s datagen gives the mini its initial checkpoint: the pinned one (``pinned.MINI``) on the
#: dataset it was trained on (the default seed 0); on any other dataset (``hpcbench run --seed S``) it fine-tunes
#: the pinned one until the weights' average scores ``MINI_START_GATE`` avg lDDT-Ca on the validation targets (a
#: ``StartGate``), at most ``MINI_PRETRAIN_STEPS`` steps (docs/openfold.md: the steps that takes, and the timed
#: run's climb from there to 0.8)
MINI_PRETRAIN_STEPS = 5000
MINI_START_GATE = 0.77
#: fine-tuning the pinned checkpoint for other data, the gate is checked every this many steps from the start
#: (it climbs ~0.05 per 100 steps there: checks 100 steps apart let it overshoot up to the target)
FINE_TUNE_CHECK_EVERY = 50


class OpenFoldDatagen(Datagen):
    """The synthetic OpenFold dataset and the mini preset's initial checkpoint."""

    @classmethod
    def add_datagen_args(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--families", type=int, default=16, help="protein families (shared segment layout)")
        parser.add_argument("--members", type=int, default=5, help="chains per family")
        parser.add_argument("--val-members", type=int, default=1,
                            help="members per family released after the training cut-off (the CAMEO targets)")
        parser.add_argument("--min-length", type=int, default=40, help="shortest chain (residues)")
        parser.add_argument("--max-length", type=int, default=80, help="longest chain (residues)")
        parser.add_argument("--msa-rows", type=int, default=24, help="MSA rows per chain (over the three A3M files)")
        parser.add_argument("--shards", type=int, default=2, help="alignment shards (<k>.db) of pdb_alignments/")
        parser.add_argument("--pretrain-steps", type=int, default=0,
                            help="also write the mini preset's initial checkpoint (openfold_mlperf/pretrain.py): "
                                 "the --pretrain-config model trained this many steps of 2 samples on the training "
                                 "chains (two processes where there are two cores); with --pretrain-until, at most "
                                 "this many")
        parser.add_argument("--pretrain-until", type=float, default=0.0, metavar="SCORE",
                            help="stop the pretraining once the weights' average scores this avg lDDT-Ca on the "
                                 f"validation targets (checked every {StartGate.every} steps from step "
                                 f"{StartGate.first}, or every {FINE_TUNE_CHECK_EVERY} from the start when "
                                 "fine-tuning the pinned checkpoint); fail if it has not by --pretrain-steps "
                                 "(0: train exactly --pretrain-steps)")
        parser.add_argument("--pinned-checkpoint", action="store_true",
                            help="write the mini preset's pinned initial checkpoint (openfold_mlperf/pinned) when the "
                                 "data are the dataset it was trained on (seed 0 and the sizes of hpcbench run); for "
                                 "other data fine-tune it on them as --pretrain-steps/--pretrain-until say (the gate "
                                 f"checked every {FINE_TUNE_CHECK_EVERY} steps; an error without --pretrain-steps)")
        parser.add_argument("--pretrain-config", default="mini", help="preset or TOML file whose model, data "
                            "settings and Adam the pretraining uses (default mini)")

    @classmethod
    def embedded_datagen_args(cls) -> list[str]:
        """The dataset the ``mini`` preset is tuned on (see configs/mini.toml)."""
        return [*PINNED.datagen_args, "--pinned-checkpoint", "--pretrain-steps", str(MINI_PRETRAIN_STEPS),
                "--pretrain-until", str(MINI_START_GATE)]

    @classmethod
    def datagen(cls, args: argparse.Namespace) -> None:
        from .data import synth

        if args.families < 1 or not 1 <= args.val_members < args.members:
            raise ConfigError("--families must be >= 1 and 1 <= --val-members < --members (each family needs "
                              "training chains and validation targets)")
        if not 8 <= args.min_length <= args.max_length:
            raise ConfigError(f"--min-length/--max-length: expected 8 <= min <= max, got {args.min_length}/"
                              f"{args.max_length}")
        if args.msa_rows < 3 or args.shards < 1:
            raise ConfigError("--msa-rows must be >= 3 (one per A3M file) and --shards >= 1")
        if args.pretrain_steps < 0:
            raise ConfigError(f"--pretrain-steps: expected >= 0 (0: no pretrained checkpoint), got {args.pretrain_steps}")
        if not 0.0 <= args.pretrain_until <= 1.0 or (args.pretrain_until and not args.pretrain_steps):
            raise ConfigError(f"--pretrain-until: expected an avg lDDT-Ca in (0, 1] with --pretrain-steps as its step "
                              f"limit, or 0 (no gate), got {args.pretrain_until}")
        if args.pinned_checkpoint and args.pretrain_config != "mini":
            raise ConfigError(f"--pinned-checkpoint: the pinned checkpoint is the mini preset's model; it cannot stand "
                              f"for --pretrain-config {args.pretrain_config!r} (pretrain one with --pretrain-steps)")
        out = Path(args.out)
        old = out / MINI_CHECKPOINT
        if old.exists():  # an earlier datagen's checkpoint, for its data: it must not sit beside these
            old.unlink()
            print(f"removed {old}, left by an earlier datagen in this folder", flush=True)
        chains = synth.generate_raw(out, synth.SynthConfig(
            families=args.families, members=args.members, min_length=args.min_length, max_length=args.max_length,
            msa_rows=args.msa_rows, seed=args.seed, val_members=args.val_members))
        synth.preprocess(out, num_shards=args.shards)
        n_val = args.families * args.val_members
        print(f"wrote {len(chains)} synthetic chains ({len(chains) - n_val} training, {n_val} validation targets; "
              f"mmCIF, A3M, HHR and the processed layout) to {out}", flush=True)
        start = None
        if args.pinned_checkpoint:
            why = PINNED.mismatch(out)
            if why is None:
                PINNED.install(out / MINI_CHECKPOINT)
                print(f"wrote the pinned mini checkpoint {out / MINI_CHECKPOINT} (sha256 {PINNED.sha256}; "
                      f"pretrained {PINNED.steps} steps of 2 samples on this dataset; avg lDDT-Ca on the "
                      f"validation targets {PINNED.score:.3f}, where a run from it starts)"
                      + ("; --pretrain-steps is not needed" if args.pretrain_steps else ""), flush=True)
                return
            if not args.pretrain_steps:
                raise ConfigError(f"--pinned-checkpoint: {why}; give --pretrain-steps (and --pretrain-until) to "
                                  "fine-tune it for this dataset")
            PINNED.verify()
            start = PINNED.file
            print(f"--pinned-checkpoint: {why}; fine-tuning it on this dataset", flush=True)
        if args.pretrain_steps:
            cls._pretrain(out, args.pretrain_config, args.pretrain_steps, args.seed, args.pretrain_until, start)

    @classmethod
    def _pretrain(cls, out: Path, config: str, steps: int, seed: int, until: float, start: Path | None) -> None:
        import torch

        from . import pretrain

        # the workload class builds the model and reads the preset (called through the light part: imported now)
        wl = registry.get("openfold") if cls is OpenFoldDatagen else cls
        torch.set_num_threads(1)  # one rank's share of a small host, as the harness runs it
        cfg = wl.load_config(config)
        path = out / MINI_CHECKPOINT

        gate = None
        if until and start is None:
            gate = StartGate(until)  # from random weights: the gate's defaults (from step 1,000)
        elif until:
            gate = StartGate(until, first=FINE_TUNE_CHECK_EVERY, every=FINE_TUNE_CHECK_EVERY)

        def progress(step: int, loss: float, checked: float | None) -> None:
            if checked is not None:
                print(f"pretraining: step {step}/{steps}, loss {loss:.2f}, the average's avg lDDT-Ca {checked:.3f} "
                      f"(gate {until})", flush=True)
            elif step % 100 == 0 or step == steps:
                print(f"pretraining: step {step}/{steps}, loss {loss:.2f}", flush=True)

        res = pretrain.pretrain(wl, cfg, out, steps, seed, path, progress, gate=gate, start=start)
        # the gate's last check scored these weights; without a gate, score the written file
        score = res.score if res.score is not None else pretrain.evaluate(wl, wl.load_config(config), out, path)
        origin = "from random weights" if start is None else f"fine-tuned from the pinned checkpoint {start}"
        print(f"wrote the pretrained {config} checkpoint {path} (sha256 {res.sha256}; {res.steps} steps of "
              f"{res.batch} training samples {origin} in {res.seconds:.0f} s on {res.processes} process(es); avg "
              f"lDDT-Ca on the validation targets {score:.3f}, where a run from it starts)")
