"""Pictures sent as OpenAI `image_url` parts: `data:` URLs only (the server fetches nothing from the network)."""

from __future__ import annotations

import base64
import binascii
import io
import re

from PIL import Image, UnidentifiedImageError

from seer_deploy.core.errors import ConfigError
from seer_deploy.models.pictures.image import MAX_IMAGE_PIXELS, to_rgb

DATA_URL = re.compile(r"data:(?P<mime>image/[\w.+-]+)?(?P<params>(;[\w-]+=[\w.-]+)*);base64,(?P<data>.*)", re.DOTALL)


def decode_data_url(url: str, where: str) -> Image.Image:
    """The RGB picture of a base64 `data:image/...` URL; ConfigError naming `where` for anything else."""
    match = DATA_URL.fullmatch(url.strip())
    if match is None:
        shown = url[:40] + ("..." if len(url) > 40 else "")
        raise ConfigError(f"{where}: image_url '{shown}' is not a base64 data URL; send the picture inline as "
                          "data:image/png;base64,... (the server fetches nothing)")
    try:
        raw = base64.b64decode(match["data"], validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ConfigError(f"{where}: the image data URL is not valid base64 ({exc}); re-encode the picture") from exc
    try:
        with Image.open(io.BytesIO(raw)) as img:
            width, height = img.size
            if width * height > MAX_IMAGE_PIXELS:
                raise ConfigError(f"{where}: the picture is {width} x {height} pixels, above the "
                                  f"{MAX_IMAGE_PIXELS} allowed; scale it down")
            img.load()
            return to_rgb(img, where)
    except Image.DecompressionBombError as exc:
        raise ConfigError(f"{where}: the picture is too large ({str(exc).split(',')[0]}); scale it down") from exc
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError) as exc:
        raise ConfigError(f"{where}: the image data URL holds no readable picture ({type(exc).__name__}); send a "
                          "PNG or JPEG") from exc
