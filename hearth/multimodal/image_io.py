"""Image bytes -> a checked PIL image, and base64 `data:` URLs -> bytes. Every failure is a ParamError naming the
problem (a 400 at the door): corrupt or truncated bytes, a format outside FORMATS, a declared size past
MAX_PIXELS (checked from the header, before any pixel is decoded)."""
from __future__ import annotations

import base64
import binascii
import io
import warnings
from urllib.parse import urlparse

from hearth.errors import ParamError

# Formats Pillow decodes that a chat image plausibly is; others (PSD, EPS, ...) are refused by name.
FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
# The largest image accepted: width x height as declared in its header (a 20000 x 20000 image is refused before
# a byte of its pixels is decoded). 8192 x 8192 covers screenshots and photos.
MAX_PIXELS = 8192 * 8192


def load_image(data: bytes, param: str = "image"):
    """Decode image bytes into an RGB PIL image. Raises ParamError(param, ...) for anything that is not one."""
    from PIL import Image, UnidentifiedImageError

    if not data:
        raise ParamError(param, "the image is empty (0 bytes)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data), formats=None)
            fmt = img.format
            if fmt not in FORMATS:
                raise ParamError(param, f"unsupported image format {fmt}: send one of {', '.join(FORMATS)}")
            w, h = img.size
            if w < 1 or h < 1 or w * h > MAX_PIXELS:
                raise ParamError(param, f"the image is {w} x {h} pixels, more than the {MAX_PIXELS} pixels "
                                        "accepted: scale it down")
            img.load()  # (truncated or corrupt pixel data fails here)
    except ParamError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):  # (Pillow's own check, at open)
        raise ParamError(param, f"the image declares more than the {MAX_PIXELS} pixels accepted: scale it "
                                "down") from None
    except UnidentifiedImageError:
        raise ParamError(param, "the image bytes are not an image in a known format (corrupt, or not an image): "
                                f"send one of {', '.join(FORMATS)}") from None
    except (OSError, SyntaxError, ValueError) as e:
        raise ParamError(param, f"the image could not be decoded (truncated or corrupt {fmt_name(data)}): "
                                f"{e}") from None
    return img.convert("RGB") if img.mode != "RGB" else img


def fmt_name(data: bytes) -> str:
    """A name for the bytes' apparent format, for error messages."""
    for magic, name in ((b"\x89PNG", "PNG"), (b"\xff\xd8", "JPEG"), (b"GIF8", "GIF"), (b"BM", "BMP"),
                        (b"RIFF", "WEBP")):
        if data.startswith(magic):
            return name
    return "image"


def decode_data_url(url: str, param: str = "image_url") -> bytes:
    """The bytes of a base64 `data:image/...;base64,...` URL. Raises ParamError for any other form."""
    head, sep, payload = url.partition(",")
    if not sep or not head.startswith("data:") or not head.endswith(";base64"):
        raise ParamError(param, "an image URL must be a base64 data URL (data:image/png;base64,...)")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ParamError(param, "the image data URL is not valid base64") from None


def check_remote_url(url: str, allowed_domains: list[str] | None, param: str = "image_url") -> str:
    """An http(s) image URL's host if --allowed-media-domains names it; else a ParamError saying how to allow it."""
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ParamError(param, "an image URL must be a base64 data URL, or an http(s) URL")
    host = parsed.hostname.lower()
    if not allowed_domains or host not in {d.lower() for d in allowed_domains}:
        raise ParamError(param, f"image URLs from {host} are not fetched: this server takes images as base64 data "
                                "URLs, or from the hosts --allowed-media-domains names")
    return host
