"""Artifact lookup lists each directory once per process and never reads another architecture's artifacts.

The listing and the reads are counted by wrappers that call the real ``os.listdir``, ``os.scandir`` and
``os.open``: lookup still lists and reads as it would.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from flyreg import Config, DeviceIdentity

from cpu_kernels import double_op
from on_disk import this_device, write_artifact


def foreign_product() -> DeviceIdentity:
    """A known GPU product of another architecture than this machine's device."""
    h200 = DeviceIdentity("NVIDIA_H200", "sm_90")
    return h200 if this_device().arch != h200.arch else DeviceIdentity("NVIDIA_A100-SXM4-80GB", "sm_80")


def test_a_directory_is_listed_once_and_foreign_artifacts_are_never_opened(
        isolated_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    configs = isolated_dirs["configs"]
    ours = write_artifact(configs, "listed", {"n": 4}, Config({"CHUNK": 16}))
    foreign = [write_artifact(configs, "listed", {"n": n}, Config({"CHUNK": 256}), device=foreign_product())
               for n in (8, 16)]  # the exact spec asked for below, on another product; and a nearer neighbour

    listed: list[Path] = []
    opened: list[str] = []

    def counting(real: Any, into: list[Any]) -> Any:
        def wrapper(path: Any = ".", *args: Any, **kwargs: Any) -> Any:
            into.append(path)
            return real(path, *args, **kwargs)
        return wrapper

    monkeypatch.setattr(os, "listdir", counting(os.listdir, listed))
    monkeypatch.setattr(os, "scandir", counting(os.scandir, listed))
    monkeypatch.setattr(os, "open", counting(os.open, opened))

    tuner, _ = double_op("listed", default=Config({"CHUNK": 1}), ordered_axes=["n"])
    first = tuner.resolve_spec({"n": 4})
    assert (first.source, first.path) == ("offline", str(ours))
    assert [Path(p) for p in listed].count(configs) == 1

    second = tuner.resolve_spec({"n": 8})  # the foreign exact spec and neighbour are skipped by their names
    assert (second.source, second.path) == ("offline-nearest", str(ours))
    assert [Path(p) for p in listed].count(configs) == 1  # the second lookup lists nothing again
    assert not {os.fspath(p) for p in foreign} & {os.fspath(p) for p in opened}
    assert str(ours) in map(os.fspath, opened)  # the reads were seen: ours was opened
