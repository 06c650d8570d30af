"""Face photos read safely: the file's size is checked before a byte is read, then the picture's size from
its header (parsed here for the formats OpenCV alone reads, by Pillow for the rest, refused where no
header tells it), and only then is it decoded. Caps: :data:`MAX_PHOTO_BYTES`, :data:`MAX_PHOTO_PIXELS`."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from vcam.errors import FaceError

#: Largest photo decoded for a face (pixels); a face needs far fewer, and a larger image could take
#: gigabytes of memory to decode (a 16000x16000 PNG is a few kilobytes on disk).
MAX_PHOTO_PIXELS = 50_000_000


#: Largest picture decoded, in bytes of the decoded array (width x height x channels x bytes per
#: sample, read from the header before decoding): a 16-bit RGBA picture takes 8 bytes a pixel, so
#: the pixel cap alone let a 7000x7000 one (a few hundred KiB as a PNG) cost 400 MB and more to decode.
MAX_DECODED_BYTES = MAX_PHOTO_PIXELS * 3


#: Largest photo file read at all (bytes): checked on the file's size before any byte is read.
MAX_PHOTO_BYTES = 64 * 1024 * 1024


_HEAD_BYTES = 64 * 1024  # enough for every header parsed here


# Formats OpenCV decodes, told apart by their first bytes as OpenCV does. Those Pillow can size are
# probed with Pillow restricted to that one format; the others have small text or fixed headers
# parsed below. Anything else (OpenEXR, AVIF...) is refused: nothing here sizes it before decoding.
_PILLOW_MAGIC = (
    (b"\xff\xd8\xff", "JPEG"),
    (b"BM", "BMP"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
    (b"\x00\x00\x00\x0cjP  \r\n\x87\n", "JPEG2000"),
    (b"\xff\x4f\xff\x51", "JPEG2000"),
    (b"GIF8", "GIF"),
)


_WHY_NOT = "use a JPEG or PNG photo"


_SCALE_DOWN = "scale it down (4000 px on the long side is plenty) and try again"


def _pnm_size(head: bytes) -> tuple[int, int] | None:
    """Width and height from a PBM/PGM/PPM header (P1-P6): magic, then width and height as decimal
    numbers separated by whitespace, with '#' comments running to the end of a line."""
    text = re.sub(rb"#[^\n\r]*", b" ", head[2:1024])
    nums = re.match(rb"\s+(\d+)\s+(\d+)\s", text)
    return (int(nums[1]), int(nums[2])) if nums else None


def _pam_size(head: bytes) -> tuple[int, int] | None:
    """Width and height from a PAM header (P7): WIDTH and HEIGHT lines before ENDHDR."""
    end = head.find(b"ENDHDR")
    if end < 0:
        return None
    fields = dict(re.findall(rb"^\s*(WIDTH|HEIGHT|DEPTH)\s+(\d+)", head[:end], re.M))
    if b"WIDTH" not in fields or b"HEIGHT" not in fields or int(fields.get(b"DEPTH", b"1")) > 4:
        return None
    return int(fields[b"WIDTH"]), int(fields[b"HEIGHT"])


def _pfm_size(head: bytes) -> tuple[int, int] | None:
    """Width and height from a PFM header: 'PF' or 'Pf', then the width and height line."""
    nums = re.match(rb"P[Ff]\s+(\d+)\s+(\d+)\s", head[:256])
    return (int(nums[1]), int(nums[2])) if nums else None


def _hdr_size(head: bytes) -> tuple[int, int] | None:
    """Width and height from a Radiance HDR header: text lines up to an empty one, then the
    resolution line such as '-Y 480 +X 640' (the axis after the first sign runs slowest)."""
    end = head.find(b"\n\n")
    if end < 0:
        return None
    res = re.match(rb"([-+])([XY]) (\d+) ([-+])([XY]) (\d+)\s", head[end + 2 : end + 2 + 64])
    if not res or res[2] == res[5]:
        return None
    first, second = int(res[3]), int(res[6])
    return (second, first) if res[2] == b"Y" else (first, second)


def _sun_size(head: bytes) -> tuple[int, int] | None:
    """Width and height from a Sun raster header (big-endian 32-bit words after the magic)."""
    return (int.from_bytes(head[4:8], "big"), int.from_bytes(head[8:12], "big")) if len(head) >= 12 else None


def _png_size(head: bytes) -> tuple[int, int] | None:
    """Width and height from a PNG's first chunk, IHDR (big-endian, right after the signature)."""
    return (int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")) if head[12:16] == b"IHDR" else None


_PNG_CHANNELS = {0: 1, 2: 3, 3: 4, 4: 2, 6: 4}  # by IHDR colour type (a palette may decode to BGRA)
_PILLOW_BYTES = {"1": 1, "L": 1, "P": 4, "LA": 2, "RGB": 3, "YCbCr": 3, "LAB": 3, "HSV": 3, "RGBA": 4, "CMYK": 4}


def _png_depth(head: bytes) -> tuple[int, int]:
    """(channels, bytes per sample) decoded from a PNG, from IHDR's bit depth and colour type."""
    bits, colour = head[24], head[25]
    return _PNG_CHANNELS.get(colour, 4), 2 if bits > 8 else 1


def _decoded_bytes(kind: str, head: bytes, mode: str | None, width: int, height: int) -> tuple[int, str]:
    """Bytes of the decoded array and a short description ('16-bit RGBA'), from the header alone.
    Formats without a parsed depth count 3 channels of their widest sample (float for PFM and HDR)."""
    if kind == "PNG":
        channels, sample = _png_depth(head)
    elif mode is not None and mode.startswith("I;16"):  # Pillow's mode from the header
        channels, sample = 1, 2
    elif mode is not None:
        channels, sample = (1, 4) if mode in ("I", "F") else (_PILLOW_BYTES.get(mode, 4), 1)
    else:
        channels, sample = 3, 4 if kind in ("PFM", "Radiance HDR") else 2 if kind in ("PNM", "PAM") else 1
    names = {1: "grey", 2: "grey+alpha", 3: "RGB", 4: "RGBA"}
    return width * height * channels * sample, f"{8 * sample}-bit {names.get(channels, 'RGBA')}"


def _parsed_size(head: bytes) -> tuple[str, tuple[int, int] | None] | None:
    """(format, size) for the formats whose header is parsed here; None for other formats."""
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG", _png_size(head)
    if re.match(rb"P[1-6]\s", head):
        return "PNM", _pnm_size(head)
    if head.startswith(b"P7"):
        return "PAM", _pam_size(head)
    if head.startswith((b"PF", b"Pf")):
        return "PFM", _pfm_size(head)
    if head.startswith((b"#?RADIANCE", b"#?RGBE")):
        return "Radiance HDR", _hdr_size(head)
    if head.startswith(b"\x59\xa6\x6a\x95"):
        return "Sun raster", _sun_size(head)
    return None


def image_size(path: Path, what: str = "photo", max_pixels: int | None = MAX_PHOTO_PIXELS) -> tuple[int, int]:
    """Width and height of the image file ``path`` from its header alone, checked against
    :data:`MAX_PHOTO_BYTES` and ``max_pixels`` (None: the caller checks the size). Reads a small
    header at most: FaceError (one line) when the file is missing, empty, too big, not an image
    OpenCV decodes, of a format whose size no header tells, or larger than the pixel cap."""
    from PIL import Image, UnidentifiedImageError

    path = Path(path)
    try:
        st = path.stat()
    except OSError:
        st = None
    if st is None or not path.is_file():
        raise FaceError(f"{what} not found: {path}", hint="check the path")
    if st.st_size == 0:
        raise FaceError(f"{path} is empty", hint=_WHY_NOT)
    if st.st_size > MAX_PHOTO_BYTES:
        raise FaceError(
            f"{path} is {st.st_size / 1e6:.1f} MB, too large for a face {what} (at most {MAX_PHOTO_BYTES // (1 << 20)} MiB)",
            hint="scale it down or save it as JPEG, and try again",
        )
    try:
        with open(path, "rb") as fh:
            head = fh.read(_HEAD_BYTES)
    except OSError as exc:
        raise FaceError(f"cannot read {path}: {exc.strerror or exc}", hint="check the file's permissions") from None
    not_image = FaceError(f"{path} is not an image that can be read", hint=_WHY_NOT)
    parsed = _parsed_size(head)
    mode: str | None = None
    if parsed is not None:
        kind, size = parsed
        if size is None:
            raise FaceError(f"{path} is not an image that can be read: its {kind} header is damaged", hint=_WHY_NOT)
    else:
        kind = next((fmt for magic, fmt in _PILLOW_MAGIC if head.startswith(magic)), None)
        if kind is None and head[:4] == b"RIFF" and head[8:12] == b"WEBP":
            kind = "WEBP"
        if kind is None:
            if head.startswith(b"v/1\x01") or head[4:12] in (b"ftypavif", b"ftypavis"):
                raise FaceError(f"{path} is in a format whose size cannot be checked before decoding", hint=_WHY_NOT)
            raise not_image
        try:
            with Image.open(path, formats=[kind]) as im:  # the header only
                size, mode = im.size, im.mode
        except (Image.DecompressionBombError, Image.DecompressionBombWarning):  # far above any cap here
            raise FaceError(f"{path} is too large for a face {what}", hint=_SCALE_DOWN) from None
        except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
            raise not_image from None
    width, height = size
    if width <= 0 or height <= 0:
        raise not_image
    if max_pixels is not None and width * height > max_pixels:
        raise FaceError(
            f"{path} is {width}x{height} pixels, too large for a face {what} (at most {max_pixels / 1e6:g} megapixels)",
            hint=_SCALE_DOWN,
        )
    decoded, depth = _decoded_bytes(kind, head, mode, width, height)
    if max_pixels is not None and decoded > MAX_DECODED_BYTES:
        raise FaceError(
            f"{path} is {width}x{height} {depth}, {decoded / 1e6:.0f} MB once decoded, too large for a face {what} "
            f"(at most {MAX_DECODED_BYTES / 1e6:.0f} MB)",
            hint=_SCALE_DOWN + "; save it as 8-bit",
        )
    return width, height


def read_photo(path: Path) -> np.ndarray:
    """Decode a photo to (H, W, 3) uint8 BGR; FaceError if it is missing, empty, not an image, too
    large to decode safely (file size and pixels, from the header: see :func:`image_size`), or fully
    transparent. Transparent parts are laid over mid-grey."""
    import cv2

    path = Path(path)
    image_size(path)
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_PHOTO_BYTES + 1)  # bounded even if the file grew since it was checked
    except OSError as exc:
        raise FaceError(f"cannot read {path}: {exc.strerror or exc}", hint="check the file's permissions") from None
    if len(data) > MAX_PHOTO_BYTES:
        raise FaceError(f"{path} grew while it was read", hint="try again once it is written")
    try:
        img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    except cv2.error:
        img = None
    del data
    if img is None or img.size == 0:
        raise FaceError(f"{path} is not an image that can be read", hint=_WHY_NOT)
    if img.dtype != np.uint8:  # 16-bit or float images
        img = (
            cv2.normalize(img, None, 0, 255, cv2.NORM_MINMAX).astype(np.uint8)
            if img.dtype.kind == "f"
            else (img >> 8).astype(np.uint8)
        )
    if img.ndim == 2:
        return cv2.cvtColor(img, cv2.COLOR_GRAY2BGR)
    if img.shape[2] == 4:
        alpha = img[..., 3:].astype(np.float32) / 255.0
        if not alpha.any():
            raise FaceError(f"{path} is fully transparent: there is no face to see", hint="use a photo with the face visible")
        return (img[..., :3].astype(np.float32) * alpha + 128.0 * (1.0 - alpha) + 0.5).astype(np.uint8)
    return img[..., :3] if img.shape[2] > 3 else img
