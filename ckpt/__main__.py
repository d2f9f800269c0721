"""``python -m ckpt``: the same as the ``ckpt`` console script."""

from ckpt.cli import app

app()
