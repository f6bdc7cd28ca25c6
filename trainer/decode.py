"""Reading and decoding image files in the loader workers, with the fastest JPEG decoder present.

Files are read whole, in one sequential `read()`, and decoded from memory: on FSx for Lustre (and
any network file system) one large read streams at full bandwidth, while a decoder that pulls a
few KiB at a time through a file object pays a round trip per pull.

JPEG decoders, fastest first (one core, 2048x1024, as measured for the design):
simplejpeg, PyTurboJPEG and OpenCV all wrap libjpeg-turbo (8-9 ms); Pillow takes 26 ms, 15 ms
when it may decode at 1/2, 1/4 or 1/8 scale in the DCT domain (`Image.draft`). The first one
importable wins; Pillow, which every training image has, is the fallback, and decodes every
other format (PNG labels, PNG images). A decoder that refuses a file hands it to Pillow.

All of them may *reduce* while decoding when the caller needs fewer pixels than the file has
(`at_least`): the decoded image is then smaller by a power of two, and the caller maps its
coordinates with `reduction(...)`. Decoders are created lazily in each process, since the
libraries' handles cannot be pickled into workers.
"""

from __future__ import annotations

import importlib
import io
import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

# Fastest first; "pillow" is always available.
DECODERS = ("simplejpeg", "turbojpeg", "opencv", "pillow")
_MODULES = {"simplejpeg": "simplejpeg", "turbojpeg": "turbojpeg", "opencv": "cv2"}
_JPEG_MAGIC = b"\xff\xd8\xff"
# libjpeg-turbo decodes at 1/1, 1/2, 1/4 and 1/8 scale in the DCT domain, nearly for free.
_REDUCTIONS = (8, 4, 2)


def read_file(path: Path) -> bytes:
    """The whole file in one sequential read (unbuffered: no copy through Python's buffer)."""
    with path.open("rb", buffering=0) as raw:
        return raw.readall()


def available_decoders() -> list[str]:
    """The JPEG decoders this environment can use, fastest first."""
    return [name for name in DECODERS if name == "pillow" or _load(name) is not None]


def pick_decoder(preference: str = "auto") -> str:
    """`auto`: the fastest one available; otherwise the one named, if it is available."""
    available = available_decoders()
    if preference == "auto":
        return available[0]
    if preference not in DECODERS:
        raise ValueError(f"unknown decoder {preference!r}; choose from auto, {', '.join(DECODERS)}")
    if preference not in available:
        raise ValueError(f"decoder {preference!r} is not installed here; available: {', '.join(available)}")
    return preference


def _load(name: str) -> Any:
    """The decoder's module (or, for PyTurboJPEG, a handle on libturbojpeg), or None."""
    try:
        module = importlib.import_module(_MODULES[name])
        if name == "turbojpeg":
            # The wheel is a ctypes wrapper: it imports fine without libturbojpeg.so present.
            return module.TurboJPEG()
    except (ImportError, OSError, RuntimeError):
        return None
    if name == "opencv":
        # OpenCV would start a thread pool per worker process: one thread, as every worker has.
        module.setNumThreads(1)
    return module


def image_size(data: bytes) -> tuple[int, int]:
    """(width, height) from the header alone."""
    with Image.open(io.BytesIO(data)) as image:
        return image.size


def reduction(source: tuple[int, int], decoded: tuple[int, int]) -> int | None:
    """The power of two a decoder reduced `source` by to get `decoded` (1: not at all), or None
    if `decoded` is no such reduction."""
    for factor in (1, *reversed(_REDUCTIONS)):
        if all(d in (s // factor, -(-s // factor)) for s, d in zip(source, decoded, strict=True)):
            return factor
    return None


class ImageDecoder:
    """Decodes image bytes to an RGB Pillow image, with the decoder chosen by name."""

    def __init__(self, name: str = "pillow") -> None:
        if name not in DECODERS:
            raise ValueError(f"unknown decoder {name!r}")
        self.name = name
        self._library: Any = None
        self._warned = False

    def __getstate__(self) -> dict[str, Any]:
        # Library handles do not pickle; each worker loads its own on first use.
        return {"name": self.name, "_library": None, "_warned": False}

    def decode_rgb(self, data: bytes, at_least: tuple[int, int] | None = None) -> Image.Image:
        """The image as RGB, possibly reduced by 2, 4 or 8 while staying at least `at_least`."""
        if self.name != "pillow" and data[:3] == _JPEG_MAGIC:
            if self._library is None:
                self._library = _load(self.name)
            try:
                return Image.fromarray(self._decode_jpeg(data, at_least))
            except (ValueError, OSError, RuntimeError, TypeError) as error:
                # An unusual JPEG (CMYK, say) the fast path refuses, or a library version with
                # another API: Pillow decodes it, and the first time says so.
                if not self._warned:
                    self._warned = True
                    warnings.warn(
                        f"{self.name} could not decode a JPEG ({error!r}); Pillow decodes it",
                        RuntimeWarning,
                        stacklevel=2,
                    )
        return _pillow_rgb(data, at_least)

    def _decode_jpeg(self, data: bytes, at_least: tuple[int, int] | None) -> np.ndarray[Any, Any]:
        library = self._library
        if self.name == "simplejpeg":
            if at_least is None:
                return library.decode_jpeg(data, colorspace="RGB")  # type: ignore[no-any-return]
            width, height = at_least
            return library.decode_jpeg(  # type: ignore[no-any-return]
                data, colorspace="RGB", min_width=width, min_height=height
            )
        factor = _factor(image_size(data), at_least)
        if self.name == "turbojpeg":
            pixel_format = importlib.import_module("turbojpeg").TJPF_RGB
            scaling = (1, factor) if factor > 1 else None
            return library.decode(  # type: ignore[no-any-return]
                data, pixel_format=pixel_format, scaling_factor=scaling
            )
        # OpenCV: reduced colour reads, and never the EXIF rotation (the label is not rotated).
        cv2 = library
        flags = cv2.IMREAD_COLOR if factor == 1 else getattr(cv2, f"IMREAD_REDUCED_COLOR_{factor}")
        bgr = cv2.imdecode(np.frombuffer(data, np.uint8), flags | cv2.IMREAD_IGNORE_ORIENTATION)
        if bgr is None:
            raise ValueError("OpenCV could not decode the image")
        return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)  # type: ignore[no-any-return]


def _factor(size: tuple[int, int], at_least: tuple[int, int] | None) -> int:
    """The largest DCT reduction that keeps the image at least `at_least`."""
    if at_least is None:
        return 1
    for factor in _REDUCTIONS:
        if all(math.ceil(s / factor) >= need for s, need in zip(size, at_least, strict=True)):
            return factor
    return 1


def _pillow_rgb(data: bytes, at_least: tuple[int, int] | None) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    if at_least is not None and image.format == "JPEG":
        # Decode at 1/2, 1/4 or 1/8 scale when that still leaves at least `at_least` pixels.
        image.draft("RGB", at_least)
    image.load()
    # Only when needed: converting an image that is already RGB still copies every pixel.
    return image if image.mode == "RGB" else image.convert("RGB")


def decode_label(data: bytes, name: str) -> Image.Image:
    """A class-id mask as an "L" image; a palette ("P") mask's indices are the class ids."""
    label = Image.open(io.BytesIO(data))
    if label.mode not in {"L", "P"}:
        raise ValueError(f"{name}: a label must be single-channel, not {label.mode}")
    label.load()
    if label.mode == "P":
        # The indices, not the colours: convert("L") would turn each colour into a luminance.
        return Image.frombytes("L", label.size, label.tobytes())
    return label
