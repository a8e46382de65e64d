"""``flyreg cache``: the scratch disk cache's path, and clearing it."""

from __future__ import annotations

import click

from flyreg._cli.common import check_op_names, user_errors


@click.group()
def cache() -> None:
    """The scratch disk cache: one SQLite database in FLYREG_CACHE_DIR, else the user cache dir."""


def _cache_op(op_name: str | None) -> None:
    """Reject an op name that is neither registered nor has cache entries (a typo)."""
    from flyreg._artifacts import cache as scratch
    from flyreg._plugins.registry import REGISTRY

    if op_name is not None and op_name not in REGISTRY.names() and op_name not in scratch.counts():
        check_op_names([op_name])


@cache.command("path")
@user_errors
def cache_path() -> None:
    """Print the cache database (every op's entries live in it)."""
    from flyreg._artifacts import cache as scratch

    click.echo(str(scratch.database()))


@cache.command("clear")
@click.argument("op_name", required=False, metavar="[OP]")
@user_errors
def cache_clear(op_name: str | None) -> None:
    """Delete OP's cache entries, or every op's, and temp files left by killed writers."""
    from flyreg._artifacts import cache as scratch

    _cache_op(op_name)
    removed = scratch.clear(op_name)
    click.echo(f"removed {removed} cache entr{'y' if removed == 1 else 'ies'} from {scratch.database()}")


