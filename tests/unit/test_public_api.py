"""The public API: every exported name resolves, and ``import flyreg`` stays light."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import flyreg


@pytest.mark.parametrize("name", flyreg.__all__)
def test_every_exported_name_resolves(name: str) -> None:
    assert getattr(flyreg, name) is not None
    assert name in dir(flyreg)


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        flyreg.nope  # noqa: B018


def test_import_loads_no_heavy_module() -> None:
    code = "import sys, json, flyreg; print(json.dumps(sorted(m for m in ('torch', 'click', 'rich', 'pluggy') if m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert json.loads(out) == []


def test_accepts_asks_the_installed_op_about_a_stored_config() -> None:
    spec = {"M": 32, "N": 1024, "backend": "cpu", "dtype": "float32"}
    served = flyreg.resolve_spec("rmsnorm", spec).config
    assert flyreg.accepts("rmsnorm", spec, served) is None
    why = flyreg.accepts("rmsnorm", spec, flyreg.Config({"NOT_A_KNOB": 1}))
    assert why is not None and "NOT_A_KNOB" in why
    with pytest.raises(flyreg.SpecError, match="dtyp"):
        flyreg.accepts("rmsnorm", {**spec, "dtyp": "float32"}, served)
