"""stoker inside training frameworks.

Lightning and ``type(loader)(**kwargs)`` re-make a ``stoker.DataLoader`` from its attributes,
which keep the requested settings: they need nothing. Hugging Face Accelerate builds its own
loader (``DataLoaderShard``, ``DataLoaderDispatcher``, ``skip_first_batches``) around a torch
DataLoader made from the given one's attributes; ``stoker.integrations.accelerate.install()``
makes that inner loader a stoker one. stoker installs it itself when a stoker.DataLoader is made
with accelerate imported (docs/frameworks.md)."""

from __future__ import annotations

import sys


def install_available() -> None:
    """Installs the integration of each framework already imported (cheap when none is)."""
    if "accelerate.data_loader" in sys.modules:
        from . import accelerate

        accelerate.install()
