"""flyreg.check_artifacts: what ``flyreg check`` reports about a directory of artifacts."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import flyreg
from flyreg import BuildCache, Config, DeviceIdentity, check_artifacts, hookimpl

from installed import plugin as installed_plugin
from on_disk import artifact_name, this_toolchain, write_artifact

OP = "validate_sum"
SPEC = {"N": 2048, "dtype": "float32"}
CHUNKS = (8, 128, 2048)


def build(config: Config, spec: dict[str, Any]) -> Callable[..., Any]:
    chunk = config.kwargs["CHUNK"]

    def launch(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        out.zero_()
        for i in range(0, x.numel(), chunk):
            out += x[i:i + chunk].sum()
        return out

    return launch


def specialize(x: torch.Tensor, out: torch.Tensor) -> dict[str, Any]:
    return {"N": x.numel(), "dtype": str(x.dtype).removeprefix("torch.")}


class ValidateSum:
    """The op registered in this process, so ``flyreg.accepts`` asks it about configs."""

    @hookimpl
    def specialize(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        return specialize(*args, **kwargs)

    @hookimpl
    def build(self, config: Config, spec: dict[str, Any]) -> Callable[..., Any]:
        return build(config, spec)

    @hookimpl
    def configs(self, spec: dict[str, Any]) -> list[Config]:
        return [Config({"CHUNK": c}) for c in CHUNKS]

    @hookimpl
    def default(self, spec: dict[str, Any]) -> Config:
        return Config({"CHUNK": 8})


@pytest.fixture
def tuned(isolated_dirs: dict[str, Path]) -> Iterator[Path]:
    """The artifact a real search of the op emits (its default, CHUNK=8, is the slowest)."""
    flyreg.register(ValidateSum(), name=OP)
    try:
        report = flyreg.op(OP).tune(torch.ones(2048), torch.zeros(()))
        assert report.winner != Config({"CHUNK": 8})
        yield Path(str(report.artifact))
    finally:
        flyreg.unregister(OP)


def edit(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def found(problems: list[Any]) -> list[tuple[str, str, str]]:
    return [(p.path.name, p.severity, p.message) for p in problems]


def test_freshly_emitted_artifacts_are_clean(tuned: Path, isolated_dirs: dict[str, Path]) -> None:
    odd = {"N": 1e20, "dtype": "a/b", "flag": True, "eps": None}  # values whose filename parts need care
    other = flyreg.autotune_builder(OP, build, lambda x, out: odd, [Config({"CHUNK": 8})], warmup=0, rep=1,
                                    build_cache=BuildCache())
    other.tune(torch.ones(8), torch.zeros(()), out_dir=tuned.parent)
    assert len(list(tuned.parent.glob("*.json"))) == 2
    assert check_artifacts([tuned.parent], {OP: "0"}) == []
    assert check_artifacts([tuned.parent]) == []


def test_renamed_file_does_not_match_its_content(tuned: Path) -> None:
    moved = tuned.with_name(tuned.name.replace("N=2048", "N=4096"))
    tuned.rename(moved)
    ((name, severity, message),) = found(check_artifacts([moved.parent], {OP: "0"}))
    assert (name, severity) == (moved.name, "error")
    assert "filename does not match its content" in message and tuned.name in message


def test_one_directory_is_checked_as_one_not_by_the_letters_of_its_name(tuned: Path) -> None:
    edit(tuned, lambda d: d["spec"].update(N=4096))
    for one in (tuned.parent, str(tuned.parent)):
        assert [(n, s) for n, s, _ in found(check_artifacts(one, {OP: "0"}))] == [(tuned.name, "error")]
    with pytest.raises(TypeError, match="dirs must be a directory or a list of directories, got int"):
        check_artifacts(123)  # type: ignore[arg-type]


def test_edited_spec_does_not_match_its_filename(tuned: Path) -> None:
    edit(tuned, lambda d: d["spec"].update(N=4096))
    assert [s for _, s, _ in found(check_artifacts([tuned.parent], {OP: "0"}))] == ["error"]


def test_int_written_as_float_still_matches(tuned: Path) -> None:
    edit(tuned, lambda d: d["spec"].update(N=2048.0))
    assert check_artifacts([tuned.parent], {OP: "0"}) == []


@pytest.mark.parametrize("text, words", [
    ("{", "unreadable JSON"),
    ('{"schema": 1}', "missing fields"),
    ("[]", "top level is list"),
])
def test_malformed_json_is_an_error(text: str, words: str, tuned: Path) -> None:
    tuned.write_text(text)
    ((_, severity, message),) = found(check_artifacts([tuned.parent], {OP: "0"}))
    assert severity == "error" and words in message


@pytest.mark.parametrize("field, value, words", [
    ("schema", 99, "schema"),
    ("spec", None, "'spec'"),
    ("device", {"name": "x"}, "'device'"),
    ("config", {"kwargs": {"CHUNK": 8}, "bogus": 1}, "unknown fields"),
])
def test_schema_errors(field: str, value: Any, words: str, tuned: Path) -> None:
    edit(tuned, lambda d: d.__setitem__(field, value))
    ((_, severity, message),) = found(check_artifacts([tuned.parent], {OP: "0"}))
    assert severity == "error" and words in message


def test_unknown_op_only_when_ops_are_known(tuned: Path) -> None:
    problems = found(check_artifacts([tuned.parent], {"rmsnorm": "1"}))
    assert [(s, "unknown op" in m) for _, s, m in problems] == [("error", True)]
    assert check_artifacts([tuned.parent]) == []


def test_unsanitized_device_name(tuned: Path) -> None:
    path = write_artifact(tuned.parent, OP, SPEC, Config({"CHUNK": 8}), device=DeviceIdentity("NVIDIA H200", "sm_90"),
                          name=artifact_name(OP, SPEC, "NVIDIA_H200"))
    problems = found(check_artifacts([tuned.parent], {OP: "0"}))
    assert [(n, s) for n, s, _ in problems] == [(path.name, "error")]
    assert "not sanitized" in problems[0][2]


def test_stale_toolchain(tuned: Path) -> None:
    edit(tuned, lambda d: d["provenance"]["toolchain"].update(torch="1.0.0"))
    for known in ({OP: "0"}, None):
        ((name, severity, message),) = found(check_artifacts([tuned.parent], known))
        assert (name, severity) == (tuned.name, "stale") and "torch" in message


def test_stale_op_version(tuned: Path) -> None:
    ((_, severity, message),) = found(check_artifacts([tuned.parent], {OP: "2"}))
    assert severity == "stale" and "op" in message
    assert check_artifacts([tuned.parent]) == []  # without the op's version only the shared toolchain is compared
    assert json.loads(tuned.read_text())["provenance"]["toolchain"] == this_toolchain("0")


def test_files_lookup_never_reads(tuned: Path) -> None:
    hidden = tuned.parent / ".hidden.json"
    hidden.write_text(tuned.read_text())
    odd = tuned.parent / "notes.json"
    odd.write_text("{}")
    (tuned.parent / "README.md").write_text("not an artifact")
    problems = found(check_artifacts([tuned.parent], {OP: "0"}))
    assert sorted((n, s) for n, s, _ in problems) == [(".hidden.json", "error"), ("notes.json", "error")]
    assert all("lookup never reads it" in m for _, _, m in problems)


def test_missing_directory_is_reported_not_raised(tmp_path: Path, tuned: Path) -> None:
    problems = check_artifacts([tmp_path / "nope", tuned.parent], {OP: "0"})
    assert [(p.path, p.severity) for p in problems] == [(tmp_path / "nope", "error")]
    assert str(problems[0]).startswith(f"{tmp_path / 'nope'}: error: ")


def test_guide_example_artifact_is_valid_and_named_as_the_guide_says(tmp_path: Path) -> None:
    guide = (Path(__file__).resolve().parents[2] / "docs" / "autotune_guide.md").read_text()
    block = guide.split("```json\n", 1)[1].split("```", 1)[0]
    data = json.loads(block)
    name = artifact_name(data["op"], data["spec"], data["device"]["name"])
    assert f"`{name}`" in guide
    (tmp_path / name).write_text(block)
    # the real rmsnorm op's spec axes (backend included), and a config it takes for that spec
    from flyreg_rmsnorm.ops import SPEC_AXES

    assert sorted(data["spec"]) == sorted(SPEC_AXES)
    problems = check_artifacts([tmp_path], {"rmsnorm": "2"}, accepts=flyreg.accepts)
    assert [p.severity for p in problems] in ([], ["stale"]), problems
    shipped = Path(__file__).resolve().parents[2] / "plugins" / "flyreg-rmsnorm" / "flyreg_rmsnorm" / "configs" / name
    if shipped.is_file():  # the example is the shipped H200 artifact of that spec
        real = json.loads(shipped.read_text())
        assert {k: real[k] for k in ("op", "spec", "device", "config")} == \
            {k: data[k] for k in ("op", "spec", "device", "config")}


def tuner_accepts(op: str, spec: dict[str, Any], config: Config) -> str | None:
    """The runtime's own check, through the op registered in this process (``flyreg check`` asks the same)."""
    assert op == OP
    return flyreg.accepts(op, spec, config)


@pytest.mark.parametrize("config, words", [
    ({"kwargs": {"CHUNK": 7}, "hints": {}}, "not among this op's"),
    ({"kwargs": {"BLOCK": 128}, "hints": {}}, "its knobs ['BLOCK'] are not this op's ['CHUNK']"),
    ({"kwargs": {"CHUNK": 128}, "hints": {"num_warps": 4}}, "not among this op's"),
])
def test_config_the_op_does_not_take_is_an_error(tuned: Path, config: dict[str, Any], words: str) -> None:
    edit(tuned, lambda d: d.__setitem__("config", config))
    assert check_artifacts([tuned.parent], {OP: "0"}) == []  # without accepts, the config is not checked
    ((name, severity, message),) = found(check_artifacts([tuned.parent], {OP: "0"}, accepts=tuner_accepts))
    assert (name, severity) == (tuned.name, "error")
    assert message.startswith(f"config not accepted by op '{OP}' for spec N=2048,dtype=float32: ") and words in message


def test_accepted_configs_pass_and_a_failing_accepts_is_reported(tuned: Path) -> None:
    assert check_artifacts([tuned.parent], {OP: "0"}, accepts=tuner_accepts) == []

    def raises(op: str, spec: dict[str, Any], config: Config) -> str | None:
        raise KeyError("backend")

    ((_, severity, message),) = found(check_artifacts([tuned.parent], {OP: "0"}, accepts=raises))
    assert severity == "error" and "configs() or default() failed on the spec: KeyError: 'backend'" in message


def test_accepts_is_asked_only_about_known_ops(tuned: Path) -> None:
    asked: list[str] = []
    problems = check_artifacts([tuned.parent], {"rmsnorm": "1"}, accepts=lambda op, s, c: asked.append(op))
    assert asked == [] and [p.severity for p in problems] == ["error"]


@pytest.mark.parametrize("status", ["broken", "disabled"])
def test_artifacts_of_unusable_ops_are_a_warning_not_unknown(tuned: Path, status: str) -> None:
    asked: list[str] = []
    problems = found(check_artifacts([tuned.parent], {"rmsnorm": "1"}, unavailable={OP: status},
                                     accepts=lambda op, s, c: asked.append(op)))
    assert problems == [(tuned.name, "warning", f"op '{OP}' is {status} here, so its config and op version "
                                                f"are not checked")]
    assert asked == []
    # a truly unknown op next to it is still an error
    write_artifact(tuned.parent, "nobody", SPEC, Config({"CHUNK": 8}))
    assert sorted(s for _, s, _ in found(check_artifacts([tuned.parent], {"rmsnorm": "1"},
                                                         unavailable={OP: status}))) == ["error", "warning"]


def test_shipped_artifacts_hold_configs_the_real_op_takes() -> None:
    shipped = Path(__file__).resolve().parents[2] / "plugins" / "flyreg-rmsnorm" / "flyreg_rmsnorm" / "configs"
    problems = check_artifacts([shipped], {"rmsnorm": "1", "fused_add_rmsnorm": "1"}, accepts=flyreg.accepts)
    assert {p.severity for p in problems} <= {"stale"}, problems


def test_every_shipped_artifact_was_tuned_on_the_current_version_of_its_op() -> None:
    # The rest of the toolchain is the H200's (CI's torch differs); the op's version is the kernels'.
    shipped = Path(__file__).resolve().parents[2] / "plugins" / "flyreg-rmsnorm" / "flyreg_rmsnorm" / "configs"
    current = {op: flyreg.op(op).version for op in ("rmsnorm", "fused_add_rmsnorm")}
    behind = []
    for path in sorted(shipped.glob("*.json")):
        art = json.loads(path.read_text())
        if art["provenance"]["toolchain"]["op"] != current.get(art["op"]):  # an unknown op counts as behind
            behind.append(path.name)
    assert not behind, f"{len(behind)} artifacts tuned on an older op version, e.g. {behind[:2]}"


def test_the_shipped_artifacts_cover_every_gpu_workload_of_both_rmsnorm_ops() -> None:
    shipped = Path(__file__).resolve().parents[2] / "plugins" / "flyreg-rmsnorm" / "flyreg_rmsnorm" / "configs"
    for op in ("rmsnorm", "fused_add_rmsnorm"):
        workloads = installed_plugin(op).workloads("cuda")
        assert len(workloads) == 15 * 3 * 5
        missing = [w for w in workloads
                   if not (shipped / artifact_name(op, w, "NVIDIA_H200")).is_file()]
        assert not missing, f"{op}: {len(missing)} GPU workloads have no shipped H200 artifact, e.g. {missing[:3]}"
