"""screening_vs_training_ratio: what screening new pairs costs against training one epoch on them.

    .venv/bin/python benchmarks/bench_screening.py [--pairs 48] [--size 512x256] [--width 0.5]

The first phase of a run with an accepted model (`trainer/screening/phase.py`) runs the model once
over up to 64 trusted validation pairs (the calibration: thresholds, competence, usual confusions,
the scenes it knows) and once over every new pair, fed by the loader's workers as training is.
Measured side by side in one run, on the same synthetic scenes (`retrain.synth`), the same model
and this machine's CPU:

- `screening_seconds_per_pair`: the whole phase (calibration included, pictures excluded) over
  `--pairs` new pairs, with a quarter as many trusted pairs, per new pair;
- `training_seconds_per_pair`: one training epoch over the same pairs (batch 4, crop = image
  size, the trainer's loss and optimiser), per pair;
- `screening_vs_training_ratio`: the first over the second. Target: at most 0.3, so that
  screening every drop adds less than a third of an epoch to a run that trains many.

Prints `name: value` lines. About a minute on two cores with the defaults.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from retrain.synth import default_version, write_scenes  # noqa: E402
from trainer.data import SegmentationDataset, parse_size, read_manifest, to_device  # noqa: E402
from trainer.flags import CITYSCAPES_CLASSES  # noqa: E402
from trainer.model import BiSeNetV2, SegmentationLoss  # noqa: E402
from trainer.screening.phase import Basis, Settings, screen_version  # noqa: E402
from trainer.screening.screener import Screener  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=48)
    parser.add_argument("--size", default="512x256")
    parser.add_argument("--width", type=float, default=0.5)
    parser.add_argument("--workers", type=int, default=0, help="loader workers for screening, as training uses")
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    classes = CITYSCAPES_CLASSES.split(",")
    size = parse_size(args.size)
    trusted_count = max(1, args.pairs // 4)
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        count = args.pairs + trusted_count
        write_scenes(root, count=count, size=size, seed=7)
        entries = read_manifest(root / "manifests" / f"{default_version(7, count, size)}.jsonl")
        entries = [
            dataclasses.replace(entry, batch="old", trust="trusted", split="val")
            if i < trusted_count
            else dataclasses.replace(entry, batch="drop", trust="new")
            for i, entry in enumerate(entries)
        ]
        new = [entry for entry in entries if entry.trust == "new"]
        model = BiSeNetV2(len(classes), width=args.width)

        # One epoch of training on the new pairs.
        train_set = SegmentationDataset(root, new)
        loader = torch.utils.data.DataLoader(train_set, batch_size=4, shuffle=True, drop_last=False)
        criterion = SegmentationLoss(aux_weight=1.0)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        model.train()
        started = time.perf_counter()
        for raw_images, raw_labels in loader:
            images, labels = to_device(raw_images, raw_labels, torch.device("cpu"), False)
            optimizer.zero_grad(set_to_none=True)
            criterion(model(images), labels).backward()
            optimizer.step()
        training = time.perf_counter() - started

        # The screening phase over the same pairs, calibrated on the trusted ones.
        accepted = BiSeNetV2(len(classes), width=args.width, aux=False)
        accepted.load_state_dict(model.state_dict(), strict=False)
        dataset = SegmentationDataset(root, entries)
        started = time.perf_counter()
        screening = screen_version(
            Screener(accepted, torch.device("cpu"), Settings.scale, workers=args.workers),
            dataset,
            entries,
            classes,
            Settings(workers=args.workers),
            model_name="bench",
            basis=Basis(),
        )
        screening_seconds = time.perf_counter() - started

    print(f"screening_pairs: {args.pairs} new, {trusted_count} trusted, {args.size}, width {args.width}")
    print(f"screening_seconds_per_pair: {screening_seconds / args.pairs:.4f}")
    print(f"training_seconds_per_pair: {training / args.pairs:.4f}")
    print(f"screening_vs_training_ratio: {screening_seconds / training:.3f}")
    assert screening.batches["drop"]["pair_count"] == args.pairs


if __name__ == "__main__":
    main()
