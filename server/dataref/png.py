"""PNG bytes within a bound: what an agent is shown is never larger than the setting says.

A figure is saved at full size if it fits; else as a 256-colour palette; else at fewer dots
per inch; and an oversized PNG from elsewhere (a kernel's figure) is scaled down.
"""

from __future__ import annotations

import io
from collections.abc import Callable

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from .config import ChartSettings

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def figure_png(fig: Figure, settings: ChartSettings) -> bytes:
    """The figure as a PNG of at most ``settings.max_png_bytes`` bytes."""
    FigureCanvasAgg(fig)  # attaches itself to the figure

    def render(dpi: float) -> bytes:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=dpi, facecolor="white", metadata={"Software": None})
        return buf.getvalue()

    return fit_png(render, settings.max_png_bytes)


def fit_png(render: Callable[[float], bytes], max_bytes: int) -> bytes:
    """Full size if it fits; else a 256-colour palette; else fewer pixels, down to a floor."""
    data = render(100)
    if len(data) <= max_bytes:
        return data
    for dpi in (100, 80, 64, 50):
        small = quantize_png(data if dpi == 100 else render(dpi))
        if len(small) <= max_bytes:
            return small
    return shrink_png(small, max_bytes)


def quantize_png(data: bytes, colors: int = 256) -> bytes:
    from PIL import Image  # Pillow comes with matplotlib

    with Image.open(io.BytesIO(data)) as img:
        pal = img.convert("RGB").quantize(colors=colors, method=Image.Quantize.MEDIANCUT)
        out = io.BytesIO()
        pal.save(out, format="PNG", optimize=True)
    return out.getvalue()


def shrink_png(data: bytes, max_bytes: int) -> bytes:
    """Scale a PNG down (keeping its aspect) until it fits; the image an agent is shown."""
    from PIL import Image

    if len(data) <= max_bytes:
        return data
    with Image.open(io.BytesIO(data)) as img:
        img.load()
        rgb = img.convert("RGB")
    scale = 1.0  # first the palette alone, then fewer pixels
    while True:
        size = (max(1, int(rgb.width * scale)), max(1, int(rgb.height * scale)))
        small = rgb.resize(size, Image.Resampling.BILINEAR) if scale < 1 else rgb
        out = io.BytesIO()
        small.quantize(colors=256, method=Image.Quantize.FASTOCTREE).save(out, format="PNG")
        if out.tell() <= max_bytes or min(size) <= 16:
            return out.getvalue()
        # Bytes grow with pixels: jump near the size that fits, then close in by steps.
        scale *= min(0.8, (max_bytes / out.tell()) ** 0.5 * 0.95)
