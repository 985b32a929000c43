"""The ``rollplan`` command-line tool (typer + rich).

Sub-commands come from the ``rollplan.cli`` entry-point group: each entry point is a function
``register(app, bench)`` that adds commands to the root app and to the ``bench`` sub-app. This keeps the
one-way imports (the executor package registers ``bench executor`` without the solver importing it).

User errors (``UserInputError``) print one line to stderr and exit with code 2; no traceback.
"""

from __future__ import annotations

import logging
import sys
from importlib.metadata import entry_points

import click
import typer

from rollplan.models.errors import RollplanError, UserInputError

app = typer.Typer(
    name="rollplan",
    help="Plan and replay elastic P/D rollout for agentic RL.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
bench = typer.Typer(help="Benchmarks that print JSON (and a table).", no_args_is_help=True)
app.add_typer(bench, name="bench")


@app.callback()
def _root(verbose: bool = typer.Option(False, "--verbose", "-v", help="Log at INFO level.")) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


def _register_plugins() -> None:
    for ep in sorted(entry_points(group="rollplan.cli"), key=lambda e: e.name):
        ep.load()(app, bench)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script. Returns the exit code (also used by tests)."""
    _register_plugins()
    try:
        app(args=argv, standalone_mode=False)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.exceptions.Abort:
        print("aborted", file=sys.stderr)
        return 1
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except UserInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RollplanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def run() -> None:
    sys.exit(main())
