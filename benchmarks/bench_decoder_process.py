"""What checking a file in the decoder's child process costs, against checking it in-process.

    .venv/bin/python benchmarks/bench_decoder_process.py [--rounds 15]

1920x1080 street-like pictures (JPEG, quality 90) and their class-id PNG masks, the files a
dash camera's drop holds, checked by `check_image` / `check_label` in this process and through a
`DecoderProcess` (the same checks in the child: the file over a pipe, the FileCheck back as
JSON), interleaved so both see the same machine state. Wall-clock medians over rounds (the child
works while this process waits). Also the child's start, paid once per execution environment
and after a file was killed. Prints `name: value` lines.
"""

from __future__ import annotations

import argparse
import io
import random
import statistics
import time
from collections.abc import Callable

from PIL import Image, ImageDraw, ImageFilter

from functions.validation import DEFAULT_CONFIG, DecoderProcess, FileCheck, Role, check_in_process

SIZE = (1920, 1080)


def street_pair(seed: int) -> tuple[bytes, bytes]:
    """A textured picture of class-id polygons, and its mask (as bench_validation.py draws them)."""
    rng = random.Random(seed)
    mask = Image.new("L", SIZE, 0)
    draw = ImageDraw.Draw(mask)
    draw.rectangle((0, 0, SIZE[0], SIZE[1] // 3), fill=10)
    for _ in range(80):
        x, y = rng.randrange(SIZE[0]), rng.randrange(SIZE[1])
        draw.polygon(
            [(x + rng.randint(-250, 250), y + rng.randint(-150, 150)) for _ in range(6)], fill=rng.randrange(19)
        )
    picture = Image.merge("RGB", [mask.point(lambda v, k=k: (v * 37 + k * 80) % 256) for k in range(3)])
    picture = Image.blend(
        picture.filter(ImageFilter.GaussianBlur(1.5)), Image.effect_noise(SIZE, 24).convert("RGB"), 0.18
    )
    return encode(picture, "JPEG", quality=90), encode(mask, "PNG")


def encode(image: Image.Image, fmt: str, **options: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def median_ms(check: Callable[[], FileCheck], rounds: list[float]) -> None:
    started = time.perf_counter()
    assert check().ok
    rounds.append((time.perf_counter() - started) * 1000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    image, label = street_pair(1)
    files = {"jpeg": (Role.IMAGE, image, "images/a.jpg"), "png_mask": (Role.LABEL, label, "labels/a.png")}

    starts = []
    for _ in range(3):
        started = time.perf_counter()
        fresh = DecoderProcess(10.0)
        fresh(Role.IMAGE, image, "images/a.jpg", DEFAULT_CONFIG)
        starts.append((time.perf_counter() - started) * 1000)
        fresh.close()
    child = DecoderProcess(10.0)
    child(Role.IMAGE, image, "images/a.jpg", DEFAULT_CONFIG)  # started
    for name, (role, data, key) in files.items():
        inside: list[float] = []
        through: list[float] = []
        for _ in range(args.rounds):
            median_ms(lambda: check_in_process(role, data, key, DEFAULT_CONFIG), inside)  # noqa: B023
            median_ms(lambda: child(role, data, key, DEFAULT_CONFIG), through)  # noqa: B023
        print(f"{name}_kib: {len(data) / 1024:.0f}")
        print(f"{name}_in_process_ms: {statistics.median(inside):.1f}")
        print(f"{name}_child_ms: {statistics.median(through):.1f}")
        print(f"{name}_child_overhead_ms: {statistics.median(through) - statistics.median(inside):.1f}")
    child.close()
    print(f"child_start_and_first_file_ms: {statistics.median(starts):.0f}")


if __name__ == "__main__":
    main()
