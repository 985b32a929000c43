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


_registered: list[str] = []
"""The entry points ``_register_plugins`` has added to ``app`` in this process (each is added once)."""


def _register_plugins() -> None:
    """Add every ``rollplan.cli`` entry point's commands to ``app`` and ``bench``, once per process: ``main``
    is called many times in one process (tests, notebooks), and typer keeps every command added, so adding
    them again on each call grew the app, and the time each later call took to build it, without end."""
    for ep in sorted(entry_points(group="rollplan.cli"), key=lambda e: e.name):
        if ep.name not in _registered:
            ep.load()(app, bench)
            _registered.append(ep.name)


def _click_exception_types() -> tuple[tuple[type[BaseException], ...], tuple[type[BaseException], ...],
                                      tuple[type[BaseException], ...]]:
    """(Exit, Abort, ClickException) classes of every click that can reach us: the click package, and the copy
    that recent typer releases bundle (``typer._click``), whose classes do not derive from click's."""
    exits: list[type[BaseException]] = [click.exceptions.Exit, typer.Exit]
    aborts: list[type[BaseException]] = [click.exceptions.Abort, typer.Abort]
    errors: list[type[BaseException]] = [click.ClickException]
    try:
        from typer._click import exceptions as bundled  # typer >= 0.17 ships its own click
    except ImportError:
        pass
    else:
        errors.append(bundled.ClickException)
    return tuple(exits), tuple(aborts), tuple(errors)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script. Returns the exit code (also used by tests).

    Every user error ends as one line on stderr and exit code 2, without a traceback: rollplan's own
    ``UserInputError``s and the command line's usage errors (missing or malformed options, unknown commands).
    """
    _register_plugins()
    exits, aborts, click_errors = _click_exception_types()
    try:
        app(args=argv, standalone_mode=False)
    except exits as exc:
        return int(getattr(exc, "exit_code", 0))
    except aborts:
        print("aborted", file=sys.stderr)
        return 1
    except click_errors as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":
            return 0  # the help was printed: asking for it is not an error
        ctx = getattr(exc, "ctx", None)
        command = ctx.command_path if ctx is not None else "rollplan"
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)  # type: ignore[union-attr]
        text = " ".join(str(message).split()).rstrip(".")
        print(f"error: {text}. To fix: see `{command} --help`.", file=sys.stderr)
        return 2
    except UserInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RollplanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def run() -> None:
    sys.exit(main())
