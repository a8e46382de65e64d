"""A candidate's output captured in this process (:func:`flyreg._search.output.captured`): descriptors 1 and 2 and
``sys.stdout``/``sys.stderr`` go into a bounded tail and come back however the block ends; a search in this
process keeps a failing candidate's tail with its failure and drops a succeeding one's."""

from __future__ import annotations

import os
import sys
import warnings

import pytest
import torch

import flyreg
from flyreg import BuildCache, Config, FlyregWarning
from flyreg._search.output import TAIL_BYTES, captured, uncaptured, with_output

from cpu_kernels import FAST, chunked_double, inputs


def _where() -> tuple[object, ...]:
    return sys.stdout, sys.stderr, os.fstat(1).st_ino, os.fstat(2).st_ino


@pytest.mark.parametrize("ending", [ValueError, KeyboardInterrupt, SystemExit])
def test_output_is_captured_bounded_and_put_back_however_the_block_ends(ending: type[BaseException],
                                                                         capfd: pytest.CaptureFixture[str]) -> None:
    before = _where()
    with pytest.raises(ending):
        with captured() as output:
            print("p" * 1_000_000)
            os.write(1, b"f" * 1_000_000 + b"\n")
            print("HIDDEN-END", file=sys.stderr)
            raise ending()
    assert _where() == before
    why = with_output("ValueError: wrong", output)
    assert why.startswith("ValueError: wrong; the end of its output: ") and why.endswith("HIDDEN-END")
    assert len(why) < TAIL_BYTES + 100
    print("after")
    seen = capfd.readouterr()
    assert "HIDDEN-END" not in seen.out + seen.err and "p" * 100 not in seen.out and seen.out == "after\n"


def test_a_nested_block_captures_nothing_of_its_own_and_warnings_are_shown_once() -> None:
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        for _ in range(3):
            with captured() as outer:
                with captured() as inner:
                    warnings.warn("raised inside", UserWarning)
                    os.write(1, b"nested\n")
            assert inner is None and outer is not None
            assert with_output("why", outer) == "why; its output: nested"
    assert [str(w.message) for w in shown] == ["raised inside"]


def test_an_uncaptured_stream_still_reaches_the_output(capfd: pytest.CaptureFixture[str]) -> None:
    with uncaptured(sys.__stderr__) as stream:  # type: ignore[arg-type]
        with captured():
            stream.write("progress\n")
            os.write(2, b"candidate\n")
    err = capfd.readouterr().err
    assert "progress" in err and "candidate" not in err


def test_a_search_in_this_process_keeps_a_failing_candidates_output_with_its_failure(
        capfd: pytest.CaptureFixture[str]) -> None:
    """What ``FLYREG_AUTOTUNE=1`` and a builder op's first call run: a search in the caller's process."""
    def build(config: Config, spec: dict[str, object]) -> object:
        chunk = int(config.kwargs["CHUNK"])  # type: ignore[arg-type]
        if chunk == 3:
            os.write(2, b"b" * 2_000_000 + b"\nBUILD-END\n")
            raise ValueError("cannot build")

        def launch(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
            if chunk == 5:
                print("p" * 2_000_000)
                os.write(1, b"LAUNCH-END\n")
                raise RuntimeError("out of resources")
            print("SUCCEEDING-CANDIDATE")
            return chunked_double(x, out, chunk)

        return launch

    tuner = flyreg.autotune_builder("loud_in_process", build, lambda x, out: {"n": int(x.shape[0])},
                                    [Config({"CHUNK": c}) for c in (2, 3, 5, 8)], build_cache=BuildCache(), **FAST)
    x, out = inputs(rows=64)
    with pytest.warns(FlyregWarning):
        assert torch.equal(tuner(x, out), x * 2)
    (report,) = tuner.reports.values()
    failed = {int(c.kwargs["CHUNK"]): why for c, why in report.failed}  # type: ignore[arg-type]
    assert failed[3].startswith("ValueError: cannot build; the end of its output: ") and failed[3].endswith("BUILD-END")
    assert failed[5].startswith("RuntimeError: out of resources; the end of its output: ")
    assert failed[5].endswith("LAUNCH-END") and len(failed[5]) < TAIL_BYTES + 100
    seen = capfd.readouterr()
    assert len(seen.out) + len(seen.err) < 20_000
    assert seen.out == "SUCCEEDING-CANDIDATE\n"  # the served call's own print; none of the search's many launches
