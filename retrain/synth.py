"""Synthetic driving scenes with exact masks, for tests and the offline run.

No street-scene data set can be downloaded here, so `write_scenes` draws them: a road with lane
marks under a vanishing point, sidewalks, terrain, buildings with windows, trees, sky, poles with
signs and traffic lights, cars and people, in perspective (far things small, near things large),
under varying light (brightness, colour cast, shadows, sensor noise). Every shape is drawn with the
same polygon into the image and into the label, without anti-aliasing, so the mask is exact; light
only ever changes the image. The result is a Cityscapes-style folder (`images/<stem>.jpg`,
`labels/<stem>.png` with train ids, 255 = ignore) plus a frozen manifest, the same shape the
curated zone has, so the trainer cannot tell it from real data.

A second layout, `layout="highway"`, draws a multi-lane road between terrain and trees with guard
rails and no buildings or people: clean data of another style. `unlabelled` paints some classes into
the image but not the label, as an annotator who left people, poles or signs out exports them.

Everything is deterministic for a seed: scene `i` of seed `s` is the same whatever the count.
"""

from __future__ import annotations

import hashlib
import io
import math
import pathlib
import random
from collections.abc import Collection

import numpy as np
from PIL import Image, ImageDraw

from functions.common.contracts import ManifestEntry, dump_manifest, split_for
from functions.common.taxonomy import CITYSCAPES_CLASSES, IGNORE_INDEX

CLASS_ID = {name: index for index, name in enumerate(CITYSCAPES_CLASSES)}
SYNTH_BATCH = "synth"

Color = tuple[int, int, int]
Point = tuple[float, float]

_BUILDING_COLORS: tuple[Color, ...] = (
    (120, 110, 100),
    (150, 140, 125),
    (95, 95, 105),
    (140, 85, 70),
    (175, 165, 145),
    (80, 80, 80),
)
_CAR_COLORS: tuple[Color, ...] = (
    (20, 30, 140),
    (160, 20, 20),
    (200, 200, 205),
    (30, 30, 35),
    (20, 110, 60),
    (210, 180, 40),
)


def default_version(seed: int, count: int, size: tuple[int, int]) -> str:
    """A dataset version name that says what it holds (valid as a Step Functions execution name)."""
    return f"synth-{size[0]}x{size[1]}-n{count}-s{seed}"


def write_scenes(
    out_dir: pathlib.Path,
    *,
    count: int,
    size: tuple[int, int],
    seed: int,
    val_fraction: float = 0.2,
    version: str | None = None,
    batch: str = SYNTH_BATCH,
    light: str = "day",
    class_map: dict[str, str] | None = None,
    layout: str = "city",
    unlabelled: Collection[str] = (),
) -> list[tuple[pathlib.Path, pathlib.Path]]:
    """Draw `count` scenes of `size` (width, height) into `out_dir`; return (image, label) paths.

    Also writes `out_dir/manifests/<version>.jsonl`, with splits from `split_for` so the trainer
    sees exactly what it would see on the FSx mount. `light="night"` draws the same streets
    dark and blue (scenes a day-trained model has not seen); `class_map` exports the labels
    with the wrong class map, as a misconfigured annotation tool would: every pixel of class
    `a` is written as `class_map[a]` (valid files, wrong labels). `layout` and `unlabelled` are
    as in `draw_scene`; the manifest's `class_pixels` count the label as written.
    """
    _skipped_ids(light, layout, unlabelled)  # fail before any folder is made
    remap = class_remap(class_map or {})
    width, height = size
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    if width < 32 or height < 16:
        raise ValueError(f"size must be at least 32x16 to draw a street, got {width}x{height}")
    version = version or default_version(seed, count, size)
    for folder in ("images", "labels", "manifests"):
        (out_dir / folder).mkdir(parents=True, exist_ok=True)

    pairs: list[tuple[pathlib.Path, pathlib.Path]] = []
    entries: list[ManifestEntry] = []
    for index in range(count):
        # Seeded per scene: scene `index` is the same whatever `count` is. Not for security.
        rng = random.Random(f"{seed}:{index}")  # noqa: S311
        image, label = draw_scene(size, rng, light=light, layout=layout, unlabelled=unlabelled)
        label = Image.fromarray(remap[np.asarray(label)]) if class_map else label
        stem = f"s{seed}-{index:05d}"
        image_bytes = _encode(image, "JPEG", quality=90)
        label_bytes = _encode(label, "PNG")
        image_path = out_dir / "images" / f"{stem}.jpg"
        label_path = out_dir / "labels" / f"{stem}.png"
        image_path.write_bytes(image_bytes)
        label_path.write_bytes(label_bytes)
        pairs.append((image_path, label_path))

        image_sha256 = hashlib.sha256(image_bytes).hexdigest()
        counts = np.bincount(np.asarray(label).ravel(), minlength=256)
        entries.append(
            ManifestEntry(
                image=f"images/{stem}.jpg",
                label=f"labels/{stem}.png",
                image_sha256=image_sha256,
                label_sha256=hashlib.sha256(label_bytes).hexdigest(),
                split=split_for(image_sha256, val_fraction),
                class_pixels={
                    str(class_id): int(counts[class_id])
                    for class_id in range(len(CITYSCAPES_CLASSES))
                    if counts[class_id]
                },
                batch=batch,
            )
        )
    (out_dir / "manifests" / f"{version}.jsonl").write_text(dump_manifest(entries))
    return pairs


def _encode(picture: Image.Image, fmt: str, **options: int) -> bytes:
    buffer = io.BytesIO()
    picture.save(buffer, format=fmt, **options)
    return buffer.getvalue()


class _Canvas:
    """An image and its label, painted together so every shape lands in both.

    Shapes of a class in `skip` land in the image only: the label keeps what was drawn behind them.
    """

    def __init__(self, width: int, height: int, skip: frozenset[int] = frozenset()) -> None:
        self.width = width
        self.height = height
        self.skip = skip
        self.image = Image.new("RGB", (width, height))
        self.label = Image.new("L", (width, height), IGNORE_INDEX)
        self._image_draw = ImageDraw.Draw(self.image)
        self._label_draw = ImageDraw.Draw(self.label)

    def polygon(self, points: list[Point], cls: str, color: Color) -> None:
        self._image_draw.polygon(points, fill=color)
        if CLASS_ID[cls] not in self.skip:
            self._label_draw.polygon(points, fill=CLASS_ID[cls])

    def rectangle(self, box: tuple[float, float, float, float], cls: str, color: Color) -> None:
        x0, y0, x1, y1 = box
        box = (min(x0, x1), min(y0, y1), max(x0, x1), max(y0, y1))
        self._image_draw.rectangle(box, fill=color)
        if CLASS_ID[cls] not in self.skip:
            self._label_draw.rectangle(box, fill=CLASS_ID[cls])

    def ellipse(self, box: tuple[float, float, float, float], cls: str, color: Color) -> None:
        self._image_draw.ellipse(box, fill=color)
        if CLASS_ID[cls] not in self.skip:
            self._label_draw.ellipse(box, fill=CLASS_ID[cls])

    def paint_only(self, box: tuple[float, float, float, float], color: Color) -> None:
        """Detail that does not change the class (windows, lane marks drawn as rectangles)."""
        self._image_draw.rectangle(box, fill=color)

    def paint_polygon_only(self, points: list[Point], color: Color) -> None:
        self._image_draw.polygon(points, fill=color)


def _jitter(color: Color, rng: random.Random, amount: int) -> Color:
    r, g, b = (max(0, min(255, c + rng.randint(-amount, amount))) for c in color)
    return (r, g, b)


LIGHTS = ("day", "night")
LAYOUTS = ("city", "highway")


def class_remap(class_map: dict[str, str]) -> np.ndarray:
    """A lookup table from train id to the id written, for `class_map` {"road": "sky", ...}."""
    table = np.arange(256, dtype=np.uint8)
    for source, target in class_map.items():
        if source not in CLASS_ID or target not in CLASS_ID:
            raise ValueError(f"class_map {source!r} -> {target!r}: both must be classes of the taxonomy")
        table[CLASS_ID[source]] = CLASS_ID[target]
    return table


def _skipped_ids(light: str, layout: str, unlabelled: Collection[str]) -> frozenset[int]:
    """Check a scene's style; return the ids of the classes left out of the label."""
    if light not in LIGHTS:
        raise ValueError(f"light must be one of {', '.join(LIGHTS)}, not {light!r}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, not {layout!r}")
    if isinstance(unlabelled, str):  # "pole" would otherwise read as the classes "p", "o", ...
        raise TypeError(f"unlabelled must be a collection of class names, not the string {unlabelled!r}")
    unknown = sorted(set(unlabelled) - CLASS_ID.keys())
    if unknown:
        raise ValueError(f"unlabelled {unknown}: must be classes of the taxonomy")
    return frozenset(CLASS_ID[name] for name in unlabelled)


def draw_scene(
    size: tuple[int, int],
    rng: random.Random,
    *,
    light: str = "day",
    layout: str = "city",
    unlabelled: Collection[str] = (),
) -> tuple[Image.Image, Image.Image]:
    """One scene: the RGB image and its train-id label, drawn back to front.

    `layout` is a `"city"` street or a `"highway"`; classes in `unlabelled` are painted into the
    image only, so the label shows what lies behind them. The image depends on `size`, `rng`,
    `light` and `layout` alone, never on `unlabelled`.
    """
    skip = _skipped_ids(light, layout, unlabelled)
    width, height = size
    canvas = _Canvas(width, height, skip)
    horizon = height * rng.uniform(0.38, 0.52)
    vanish_x = width * rng.uniform(0.35, 0.65)

    _draw_sky(canvas, horizon, rng)
    if layout == "highway":
        _draw_highway(canvas, horizon, vanish_x, rng)
    else:
        _draw_buildings(canvas, horizon, rng)
        _draw_ground(canvas, horizon, vanish_x, rng)
        _draw_trees(canvas, horizon, rng)
        _draw_street_objects(canvas, horizon, vanish_x, rng)
    return _light(canvas.image, horizon, rng, night=light == "night"), canvas.label


def _draw_sky(canvas: _Canvas, horizon: float, rng: random.Random) -> None:
    overcast = rng.random() < 0.35
    top: Color = (150, 155, 165) if overcast else (60, 110, 190)
    bottom: Color = (200, 200, 205) if overcast else (170, 200, 230)
    canvas.rectangle((0, 0, canvas.width - 1, horizon + 1), "sky", top)
    rows = math.ceil(horizon) + 1
    for row in range(rows):
        t = row / max(1, rows - 1)
        shade = tuple(int(a + (b - a) * t) for a, b in zip(top, bottom, strict=True))
        canvas.paint_only((0, row, canvas.width - 1, row), (shade[0], shade[1], shade[2]))


def _draw_buildings(canvas: _Canvas, horizon: float, rng: random.Random) -> None:
    x = -rng.uniform(0, canvas.width * 0.1)
    while x < canvas.width:
        block = canvas.width * rng.uniform(0.08, 0.25)
        if rng.random() < 0.15:  # a gap: sky down to the horizon
            x += block * 0.5
            continue
        top = rng.uniform(0.02, 0.75) * horizon
        color = _jitter(rng.choice(_BUILDING_COLORS), rng, 12)
        canvas.rectangle((x, top, x + block, horizon + 2), "building", color)
        window = _jitter((40, 50, 65) if rng.random() < 0.7 else (215, 205, 150), rng, 10)
        step_x = max(3.0, block / rng.randint(3, 6))
        step_y = max(3.0, (horizon - top) / rng.randint(3, 8))
        wy = top + step_y * 0.4
        while wy + step_y * 0.5 < horizon:
            wx = x + step_x * 0.3
            while wx + step_x * 0.5 < x + block:
                canvas.paint_only((wx, wy, wx + step_x * 0.45, wy + step_y * 0.45), window)
                wx += step_x
            wy += step_y
        x += block


def _draw_ground(canvas: _Canvas, horizon: float, vanish_x: float, rng: random.Random) -> None:
    width, height = canvas.width, canvas.height
    bottom = height - 1
    sidewalk = _jitter((165, 150, 155), rng, 15)
    canvas.rectangle((0, horizon, width - 1, bottom), "sidewalk", sidewalk)

    # Terrain strips beyond the sidewalks, converging on the vanishing point like the road.
    for side in (-1, 1):
        if rng.random() < 0.5:
            outer = vanish_x + side * width * rng.uniform(0.9, 1.6)
            inner = vanish_x + side * width * rng.uniform(0.65, 0.85)
            grass = _jitter((110, 150, 70), rng, 20)
            canvas.polygon([(vanish_x, horizon), (inner, bottom), (outer, bottom)], "terrain", grass)

    half_bottom = width * rng.uniform(0.32, 0.55)
    asphalt = _jitter((75, 72, 78), rng, 12)
    left, right = vanish_x - half_bottom, vanish_x + half_bottom
    road = [(vanish_x - 1, horizon), (vanish_x + 1, horizon), (right, bottom), (left, bottom)]
    canvas.polygon(road, "road", asphalt)
    curb = _jitter((200, 195, 190), rng, 10)
    for edge in (left, right):  # curbs belong to the sidewalk in Cityscapes
        canvas.polygon(
            [(vanish_x, horizon), (edge, bottom), (edge + (edge - vanish_x) * 0.04, bottom)],
            "sidewalk",
            curb,
        )

    # Lane marks are road in Cityscapes: they change the image, not the label.
    paint: Color = (235, 235, 230) if rng.random() < 0.8 else (230, 190, 40)
    lanes = rng.choice((1, 2))
    for lane in range(1, lanes + 1):
        _dashed_line(canvas, horizon, vanish_x, (lane / (lanes + 1) - 0.5) * 2 * half_bottom, paint)


def _dashed_line(canvas: _Canvas, horizon: float, vanish_x: float, offset: float, paint: Color) -> None:
    """A dashed lane mark meeting the bottom edge `offset` pixels from the vanishing point."""
    width, bottom = canvas.width, canvas.height - 1
    dashes = 6
    for dash in range(dashes):
        t0 = (dash + 0.2) / dashes
        t1 = (dash + 0.6) / dashes
        y0 = horizon + (bottom - horizon) * t0**1.5
        y1 = horizon + (bottom - horizon) * t1**1.5
        half0 = max(0.5, 0.015 * width * (y0 - horizon) / (bottom - horizon))
        half1 = max(0.5, 0.015 * width * (y1 - horizon) / (bottom - horizon))
        x0 = vanish_x + offset * (y0 - horizon) / (bottom - horizon)
        x1 = vanish_x + offset * (y1 - horizon) / (bottom - horizon)
        canvas.paint_polygon_only([(x0 - half0, y0), (x0 + half0, y0), (x1 + half1, y1), (x1 - half1, y1)], paint)


def _draw_trees(canvas: _Canvas, horizon: float, rng: random.Random) -> None:
    for _ in range(rng.randint(0, 5)):
        x = rng.uniform(0, canvas.width)
        base = horizon + rng.uniform(0, 0.12) * canvas.height
        radius = canvas.height * rng.uniform(0.08, 0.2)
        trunk = max(1.0, radius * 0.15)
        green = _jitter((70, 110, 40), rng, 25)
        canvas.rectangle((x - trunk, base - radius, x + trunk, base), "vegetation", (80, 60, 40))
        canvas.ellipse((x - radius, base - radius * 2.6, x + radius, base - radius * 0.6), "vegetation", green)


def _draw_street_objects(canvas: _Canvas, horizon: float, vanish_x: float, rng: random.Random) -> None:
    """Cars on the road, people, poles, signs and lights on the sidewalks, far ones first."""
    width, height = canvas.width, canvas.height
    things: list[tuple[float, str, float]] = []  # (base y, kind, side or lane position)
    things += [(rng.uniform(0.1, 1.0), "car", rng.uniform(-0.8, 0.8)) for _ in range(rng.randint(0, 4))]
    things += [(rng.uniform(0.25, 1.0), "person", rng.choice((-1, 1))) for _ in range(rng.randint(0, 4))]
    things += [(rng.uniform(0.3, 1.0), "pole", rng.choice((-1, 1))) for _ in range(rng.randint(1, 3))]
    for depth, kind, where in sorted(things):
        # depth 0 is the horizon, 1 the bottom edge; sizes grow linearly with it (pinhole camera).
        base = horizon + (height - 1 - horizon) * depth
        scale = depth * height
        if kind == "car":
            road_half = (base - horizon) / (height - horizon) * width * 0.45
            _draw_car(canvas, vanish_x + where * road_half, base, scale, rng)
        elif kind == "person":
            x = vanish_x + where * ((base - horizon) / (height - horizon) * width * 0.6 + 4)
            _draw_person(canvas, x, base, scale, rng)
        else:
            x = vanish_x + where * ((base - horizon) / (height - horizon) * width * 0.55 + 3)
            _draw_pole(canvas, x, base, scale, rng)


def _draw_car(canvas: _Canvas, x: float, base: float, scale: float, rng: random.Random) -> None:
    half = max(3.0, scale * rng.uniform(0.35, 0.5))
    body_h = half * 0.55
    color = _jitter(rng.choice(_CAR_COLORS), rng, 15)
    canvas.rectangle((x - half, base - body_h, x + half, base - body_h * 0.25), "car", color)
    cabin = [
        (x - half * 0.75, base - body_h),
        (x - half * 0.5, base - body_h * 1.7),
        (x + half * 0.5, base - body_h * 1.7),
        (x + half * 0.75, base - body_h),
    ]
    canvas.polygon(cabin, "car", color)
    # Windows and wheels are car in Cityscapes: the label keeps the whole silhouette.
    canvas.paint_polygon_only(
        [
            (x - half * 0.62, base - body_h * 1.05),
            (x - half * 0.45, base - body_h * 1.55),
            (x + half * 0.45, base - body_h * 1.55),
            (x + half * 0.62, base - body_h * 1.05),
        ],
        (35, 45, 60),
    )
    wheel = max(1.0, body_h * 0.35)
    for wx in (x - half * 0.6, x + half * 0.6):
        canvas.ellipse((wx - wheel, base - wheel * 2, wx + wheel, base), "car", (15, 15, 15))


def _draw_person(canvas: _Canvas, x: float, base: float, scale: float, rng: random.Random) -> None:
    tall = max(6.0, scale * rng.uniform(0.45, 0.6))
    half = max(1.0, tall * 0.16)
    shirt = _jitter(rng.choice(((180, 40, 40), (40, 60, 150), (230, 230, 220), (60, 60, 60))), rng, 25)
    canvas.rectangle((x - half * 0.8, base - tall * 0.45, x + half * 0.8, base), "person", (35, 35, 50))
    canvas.rectangle((x - half, base - tall * 0.82, x + half, base - tall * 0.45), "person", shirt)
    head = max(1.0, tall * 0.09)
    skin = _jitter((200, 160, 130), rng, 30)
    canvas.ellipse((x - head, base - tall, x + head, base - tall * 0.82), "person", skin)


def _draw_pole(
    canvas: _Canvas, x: float, base: float, scale: float, rng: random.Random, *, sign_only: bool = False
) -> None:
    tall = max(10.0, scale * rng.uniform(0.9, 1.3))
    half = max(1.0, tall * 0.035)
    canvas.rectangle((x - half, base - tall, x + half, base), "pole", _jitter((110, 110, 115), rng, 15))
    top = base - tall
    size = max(4.0, tall * 0.18)
    # Short-circuits for highways only, so city scenes draw the same numbers as before.
    if not sign_only and rng.random() < 0.5:
        # A traffic light: a dark box with one lit lamp (the lamp is still traffic light).
        canvas.rectangle((x - size * 0.4, top, x + size * 0.4, top + size * 1.2), "traffic light", (30, 30, 30))
        lamp: Color = rng.choice(((230, 40, 30), (240, 180, 20), (40, 220, 90)))
        row = rng.randint(0, 2)
        y0 = top + size * (0.1 + 0.35 * row)
        canvas.paint_only((x - size * 0.2, y0, x + size * 0.2, y0 + size * 0.25), lamp)
    else:
        shape = rng.choice(("circle", "triangle", "square"))
        face: Color = rng.choice(((200, 30, 30), (30, 70, 180), (240, 200, 30)))
        box = (x - size * 0.5, top, x + size * 0.5, top + size)
        if shape == "circle":
            canvas.ellipse(box, "traffic sign", face)
        elif shape == "triangle":
            canvas.polygon(
                [(x, top), (x + size * 0.5, top + size), (x - size * 0.5, top + size)],
                "traffic sign",
                face,
            )
        else:
            canvas.rectangle(box, "traffic sign", face)


def _draw_highway(canvas: _Canvas, horizon: float, vanish_x: float, rng: random.Random) -> None:
    """A motorway: a wide road of 2-4 lanes between terrain and trees, guard rails, cars and signs."""
    width, bottom = canvas.width, canvas.height - 1
    canvas.rectangle((0, horizon, width - 1, bottom), "terrain", _jitter((115, 140, 75), rng, 20))
    if rng.random() < 0.7:
        _draw_treeline(canvas, horizon, rng)
    # Wider than the city road: at the bottom edge it spans the frame, leaving terrain at the sides.
    half_bottom = width * rng.uniform(0.65, 0.95)
    left, right = vanish_x - half_bottom, vanish_x + half_bottom
    road = [(vanish_x - 1, horizon), (vanish_x + 1, horizon), (right, bottom), (left, bottom)]
    canvas.polygon(road, "road", _jitter((80, 78, 82), rng, 12))
    lanes = rng.randint(2, 4)
    paint = _jitter((235, 235, 230), rng, 8)
    for lane in range(1, lanes):
        _dashed_line(canvas, horizon, vanish_x, (lane / lanes - 0.5) * 2 * half_bottom, paint)
    steel = _jitter((165, 168, 172), rng, 12)
    rail = (bottom - horizon) * rng.uniform(0.08, 0.14)
    for side in rng.choice(((-1,), (1,), (-1, 1))):
        # A guard rail is fence in Cityscapes: a band on the road edge, thickening towards the camera.
        edge = vanish_x + side * half_bottom * 1.03
        canvas.polygon([(vanish_x, horizon), (edge, bottom), (edge, bottom - rail)], "fence", steel)
    _draw_highway_objects(canvas, horizon, vanish_x, rng, half_bottom=half_bottom, lanes=lanes)


def _draw_treeline(canvas: _Canvas, horizon: float, rng: random.Random) -> None:
    """Far woods along the horizon, where a city street has its buildings."""
    crest = horizon * rng.uniform(0.75, 0.92)
    points: list[Point] = [(0.0, horizon + 1)]
    x = 0.0
    while x < canvas.width:
        points.append((x, crest - rng.uniform(0, 0.08) * horizon))
        x += canvas.width * rng.uniform(0.03, 0.08)
    points += [(canvas.width - 1.0, crest), (canvas.width - 1.0, horizon + 1)]
    canvas.polygon(points, "vegetation", _jitter((60, 95, 45), rng, 20))


def _draw_highway_objects(
    canvas: _Canvas, horizon: float, vanish_x: float, rng: random.Random, *, half_bottom: float, lanes: int
) -> None:
    """Trees and bushes beyond the road, cars in their lanes, signs on poles; far ones first."""
    things: list[tuple[float, str, float]] = []  # (depth, kind, side or lane centre in -1..1)
    things += [(rng.uniform(0.05, 1.0), "tree", rng.choice((-1, 1))) for _ in range(rng.randint(2, 6))]
    things += [
        (rng.uniform(0.1, 1.0), "car", (rng.randrange(lanes) + 0.5) / lanes * 2 - 1) for _ in range(rng.randint(1, 4))
    ]
    things += [(rng.uniform(0.3, 1.0), "pole", rng.choice((-1, 1))) for _ in range(rng.randint(0, 2))]
    for depth, kind, where in sorted(things):
        base = horizon + (canvas.height - 1 - horizon) * depth
        scale = depth * canvas.height
        road_half = half_bottom * depth
        if kind == "car":
            _draw_car(canvas, vanish_x + where * road_half, base, scale, rng)
        elif kind == "tree":
            _draw_roadside_tree(canvas, vanish_x + where * road_half * 1.1, base, scale, rng, side=where)
        else:
            _draw_pole(canvas, vanish_x + where * (road_half * 1.12 + 3), base, scale, rng, sign_only=True)


def _draw_roadside_tree(
    canvas: _Canvas, edge: float, base: float, scale: float, rng: random.Random, *, side: float
) -> None:
    """A tree or a bush standing on the terrain just beyond `edge`, away from the road."""
    radius = max(1.5, scale * rng.uniform(0.1, 0.25))
    x = edge + side * radius * 1.2
    green = _jitter((65, 105, 40), rng, 25)
    if rng.random() < 0.4:
        canvas.ellipse((x - radius, base - radius, x + radius, base + radius * 0.2), "vegetation", green)
        return
    trunk = max(1.0, radius * 0.15)
    canvas.rectangle((x - trunk, base - radius, x + trunk, base), "vegetation", (80, 60, 40))
    canvas.ellipse((x - radius, base - radius * 2.6, x + radius, base - radius * 0.6), "vegetation", green)


def _light(image: Image.Image, horizon: float, rng: random.Random, *, night: bool = False) -> Image.Image:
    """Light changes the picture, never the label: brightness, colour cast, a shadow, noise."""
    pixels = np.asarray(image, dtype=np.float32)
    gain = rng.uniform(0.45, 1.3)
    cast = np.array([rng.uniform(0.85, 1.15) for _ in range(3)], dtype=np.float32)
    if night:
        # Dark and blue, as street lights and a night sky make it: what a day model never saw.
        gain, cast = gain * 0.3, cast * np.array([0.7, 0.8, 1.3], dtype=np.float32)
    pixels = pixels * gain * cast
    if rng.random() < 0.5:
        # A building's shadow across part of the ground.
        width = pixels.shape[1]
        start = int(rng.uniform(0, width * 0.7))
        stop = int(start + rng.uniform(0.2, 0.5) * width)
        pixels[int(horizon) :, start:stop] *= rng.uniform(0.45, 0.75)
    noise = np.random.default_rng(rng.getrandbits(64)).normal(0.0, rng.uniform(2, 8), pixels.shape)
    pixels = np.clip(pixels + noise, 0, 255).astype(np.uint8)
    return Image.fromarray(pixels)
