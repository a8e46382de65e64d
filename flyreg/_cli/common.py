"""What the ``flyreg`` commands share: the user-error wrapper, spec and device options, the artifact dir."""

from __future__ import annotations

import functools
import json
import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

_DEVICE = re.compile(r"(cpu|cuda)(?::(\d+))?")


def user_errors(fn: F) -> F:
    """Turn flyreg's user-facing errors into one line and a non-zero exit (2 for an unknown op or a bad spec)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from flyreg._core.keys import SpecError
        from flyreg._core.text import one_line
        from flyreg._plugins.manager import PluginError
        from flyreg._plugins.registry import OpUnavailableError, UnknownOpError

        try:
            return fn(*args, **kwargs)
        except (UnknownOpError, SpecError) as e:
            raise click.UsageError(one_line(e, typed=False)) from None
        except (OpUnavailableError, PluginError, LookupError, ValueError, TypeError) as e:
            raise click.ClickException(one_line(e, typed=False)) from None
        except OSError as e:
            where = f": {e.filename}" if e.filename else ""
            raise click.ClickException(f"{e.strerror or e}{where}") from None

    return wrapper  # type: ignore[return-value]


# -- option parsing ---------------------------------------------------------------------------------
def parse_spec(text: str, option: str = "--spec") -> dict[str, Any]:
    """``"N=4096,dtype=bfloat16"`` -> ``{"N": 4096, "dtype": "bfloat16"}`` (values read as JSON when they parse);
    errors name ``option``."""
    spec: dict[str, Any] = {}
    for part in text.split(","):
        name, sep, raw = part.partition("=")
        name, raw = name.strip(), raw.strip()
        if not sep or not name or not raw:
            raise click.BadParameter(f"expected AXIS=VALUE[,AXIS=VALUE...], got {text!r}", param_hint=option)
        if name in spec:
            raise click.BadParameter(f"axis {name!r} given twice in {text!r}", param_hint=option)
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        if isinstance(value, (dict, list)):
            raise click.BadParameter(f"axis {name!r} must be a scalar, got {raw!r}", param_hint=option)
        if isinstance(value, float) and not math.isfinite(value):  # json reads NaN and Infinity
            raise click.BadParameter(f"axis {name!r} must be finite, got {raw!r}", param_hint=option)
        spec[name] = value
    return spec


def spec_values(_ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for v in values:
        spec = parse_spec(v, param.opts[0] if param.opts else "--spec")
        if spec not in out:
            out.append(spec)
    return out


def device_syntax(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """Reject a malformed ``--device`` at once, before torch is imported."""
    if value is None:
        return None
    m = _DEVICE.fullmatch(value.strip().lower())
    if m is None or (m[1] == "cpu" and m[2] not in (None, "0")):
        raise click.BadParameter(f"expected cpu, cuda or cuda:N, got {value!r}", param_hint="--device")
    return "cpu" if m[1] == "cpu" else m[0]


def ray_address(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """``--ray``'s address ("local" when given alone); Ray must be installed."""
    if value is None:
        return None
    from flyreg._ray.pool import ray_missing

    missing = ray_missing()
    if missing is not None:
        raise click.ClickException(missing)
    if value not in ("local", "auto") and ":" not in value:
        raise click.BadParameter(f"expected a Ray address (HOST:PORT, ray://HOST:PORT or auto), got {value!r}; "
                                 f"for a local instance put --ray after the OPs, or write --ray=local",
                                 param_hint="--ray")
    return value


def resolve_device(device: str | None) -> str:
    """``device`` (already syntax-checked) checked against this machine; None picks a GPU if present."""
    if device == "cpu":
        return device
    import torch

    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "no CUDA support"
        raise click.BadParameter(f"{device!r}: no CUDA device is available here (torch {torch.__version__}, {build})",
                                 param_hint="--device")
    count = torch.cuda.device_count()
    _, _, index = device.partition(":")
    if index and int(index) >= count:
        raise click.BadParameter(f"{device!r}: no such device; this machine has {count} CUDA device(s), "
                                 f"cuda:0 to cuda:{count - 1}", param_hint="--device")
    return device


class PositiveNumber(click.FloatRange):
    """A finite number > 0 (``nan``, ``inf`` and ``1e999`` refused: a budget or margin must bound something)."""

    name = "positive number"

    def __init__(self) -> None:
        super().__init__(min=0, min_open=True)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


def given_path(_ctx: click.Context, param: click.Parameter, value: str | None) -> Path | None:
    """A path option's value as a Path; an empty one is refused (it would name the current directory)."""
    if value is None:
        return None
    if not value.strip():
        option = (param.opts or [f"--{param.name}"])[0]
        raise click.BadParameter(f"expected a path, got {value!r}", param_hint=option)
    return Path(value)


def writable_file(path: Path, option: str) -> Path:
    """``path``, checked before any work: not a directory, under a writable directory (made where missing)."""
    target = path.absolute()
    if target.is_dir():
        raise click.BadParameter(f"{str(path)!r} is a directory", param_hint=option)
    existing = target.parent  # the write creates the directories missing: the nearest that exists must take them
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise click.BadParameter(f"cannot write {str(path)!r}: {str(existing)!r} is not a writable directory",
                                 param_hint=option)
    return path


def check_op_names(names: list[str]) -> None:
    """Raise UnknownOpError (with the closest name) for the first name no distribution registers."""
    from flyreg._plugins.registry import REGISTRY

    known = set(REGISTRY.names())
    for name in names:
        if not name.strip():
            raise click.BadParameter(f"expected an op name, got {name!r}", param_hint="OP")
        if name not in known:
            REGISTRY.plugin(name)  # raises the registry's own "unknown op ...; did you mean ...?"


def artifact_dir(out: Path | None, create: bool) -> Path:
    """The artifact directory, checked writable (and created unless ``create`` is false)."""
    from flyreg._artifacts.store import emit_dir
    from flyreg._core.settings import current, expand_path

    given = out is not None
    directory = (expand_path(str(out)) if out is not None else emit_dir()).absolute()
    what = "--out" if given else ("FLYREG_CONFIG_DIR" if current().config_dirs else "config dir")
    if directory.exists() and not directory.is_dir():
        raise click.BadParameter(f"{str(directory)!r} is not a directory", param_hint=what)
    if not create:
        return directory
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise click.BadParameter(f"cannot create {str(directory)!r}: {e.strerror or e}", param_hint=what) from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise click.BadParameter(f"{str(directory)!r} is not writable", param_hint=what)
    return directory


def device_option(what: str) -> Callable[[F], F]:
    """The ``--device`` option; ``what`` starts its help (``Device to tune on``)."""
    return click.option("--device", default=None, callback=device_syntax, metavar="cpu|cuda[:N]",
                        help=f"{what} (default: a GPU if present, else the CPU).")


