"""A candidate's output captured in this process (:func:`flyreg._search.output.captured`): descriptors 1 and 2 and
``sys.stdout``/``sys.stderr`` go into a bounded tail and come back however the block ends."""

from __future__ import annotations

import os
import sys
import warnings

import pytest

from flyreg._search.output import TAIL_BYTES, captured, uncaptured, with_output


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
