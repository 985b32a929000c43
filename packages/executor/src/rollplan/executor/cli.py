"""CLI commands of this module (registered through the ``rollplan.cli`` entry-point group)."""

from __future__ import annotations

import typer


def register(app: typer.Typer, bench: typer.Typer) -> None:
    """Add this module's commands to the root app and the ``bench`` sub-app."""
