"""Validation throughput, and its cost relative to decoding the same files.

    .venv/bin/python benchmarks/bench_validation.py [--pairs 4] [--rounds 7]

Generates a few 2048x1024 street-like JPEG images (quality 90, textured so the entropy decoder
has real work) with class-id PNG masks of polygons, then, in one process and interleaved so
both see the same machine state:
- bare: `Image.open(...).load()` of the image and of the mask (the same Pillow decoders);
- validator: `validate_pair(...)`, which decodes each file once plus hashes, header checks
  and the mask histogram.
CPU time of this process (one core), median over rounds. Prints `name: value` lines.
"""

from __future__ import annotations

import argparse
import io
import random
import statistics
import time
from collections.abc import Callable

from PIL import Image, ImageDraw, ImageFilter

from functions.common.taxonomy import CITYSCAPES_COLORS
from functions.validation import InMemoryContentIndex, validate_pair

SIZE = (2048, 1024)


def street_pair(seed: int) -> tuple[bytes, bytes]:
    """A JPEG picture and its PNG mask: polygons of class ids, colored and textured."""
    rng = random.Random(seed)
    mask = Image.new("L", SIZE, 0)
    draw = ImageDraw.Draw(mask)
    draw.rectangle((0, 0, SIZE[0], SIZE[1] // 3), fill=10)  # sky
    for _ in range(80):
        x, y = rng.randrange(SIZE[0]), rng.randrange(SIZE[1])
        corners = [(x + rng.randint(-250, 250), y + rng.randint(-150, 150)) for _ in range(6)]
        draw.polygon(corners, fill=rng.randrange(19))
    draw.rectangle((0, SIZE[1] - 40, 300, SIZE[1]), fill=255)  # an unlabeled corner
    palette = [channel for color in CITYSCAPES_COLORS for channel in color]
    colored = mask.convert("P")
    colored.putpalette(palette + [0] * (768 - len(palette)))
    picture = colored.convert("RGB").filter(ImageFilter.GaussianBlur(1.5))
    noise = Image.effect_noise(SIZE, 24).convert("RGB")
    picture = Image.blend(picture, noise, 0.18)
    return encode(picture, "JPEG", quality=90), encode(mask, "PNG")


def encode(image: Image.Image, fmt: str, **options: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def bare_decode(image: bytes, mask: bytes) -> None:
    for data in (image, mask):
        with Image.open(io.BytesIO(data)) as opened:
            opened.load()


def validate(image: bytes, mask: bytes) -> None:
    # A fresh index per call: every pair is judged in full, none short-cut as a duplicate.
    result = validate_pair(image, "images/a.jpg", mask, "labels/a.png", index=InMemoryContentIndex())
    if result.status != "valid":
        raise SystemExit(f"benchmark pair rejected: {result.reasons}")


def cpu_seconds(work: Callable[[bytes, bytes], None], pairs: list[tuple[bytes, bytes]]) -> float:
    started = time.process_time()
    for image, mask in pairs:
        work(image, mask)
    return time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()

    pairs = [street_pair(seed) for seed in range(args.pairs)]
    validate(*pairs[0])  # warm up imports and Pillow's plugins
    bare_decode(*pairs[0])
    bare, validator = [], []
    for _ in range(args.rounds):
        bare.append(cpu_seconds(bare_decode, pairs))
        validator.append(cpu_seconds(validate, pairs))
    bare_s, validator_s = statistics.median(bare), statistics.median(validator)

    image_kb = statistics.mean(len(image) for image, _ in pairs) / 1024
    mask_kb = statistics.mean(len(mask) for _, mask in pairs) / 1024
    print(f"pair_size: {SIZE[0]}x{SIZE[1]}")
    print(f"pairs_per_round: {args.pairs}")
    print(f"rounds: {args.rounds}")
    print(f"jpeg_kib_mean: {image_kb:.0f}")
    print(f"mask_png_kib_mean: {mask_kb:.0f}")
    print(f"decode_pairs_per_second_per_core: {args.pairs / bare_s:.1f}")
    print(f"validation_pairs_per_second_per_core: {args.pairs / validator_s:.1f}")
    print(f"validation_vs_decode_ratio: {validator_s / bare_s:.3f}")


if __name__ == "__main__":
    main()
