"""``save_figure``: every figure the project writes (results, studies' reports), as a PNG written whole."""
from __future__ import annotations

import io
from pathlib import Path

from common.files import write_atomic


def save_figure(fig, path: Path, dpi: int = 110) -> Path:
    """``fig`` (matplotlib) as a PNG at ``path``, written whole or not at all (``write_atomic``), then closed."""
    import matplotlib.pyplot as plt  # here: the figure's caller has chosen matplotlib's backend

    fig.tight_layout()
    image = io.BytesIO()
    fig.savefig(image, dpi=dpi, format="png")
    plt.close(fig)
    return write_atomic(path, image.getvalue())
