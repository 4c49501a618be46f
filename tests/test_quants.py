"""Choosing the model file in a repo listing: hand-picked listings, exact choices (llama.cpp's rules)."""

from __future__ import annotations

import pytest

from runner.errors import ModelNotFound
from runner.hub.quants import RepoFile, choose, describe_offer, is_model_file, quant_of, split_info

pytestmark = pytest.mark.fast

GB = 10**9
LISTING = [
    RepoFile("README.md", 5000),
    RepoFile("model-Q2_K.gguf", 3 * GB),
    RepoFile("model-Q4_K_S.gguf", 4 * GB),
    RepoFile("model-Q4_K_M.gguf", 5 * GB),
    RepoFile("model-Q8_0.gguf", 8 * GB),
    RepoFile("model-IQ4_XS.gguf", 4 * GB),
    RepoFile("mmproj-model-f16.gguf", GB),
    RepoFile("model.imatrix.gguf", 10),
]
SPLIT = [
    RepoFile("Q8_0/big-Q8_0-00002-of-00003.gguf", 2 * GB),
    RepoFile("Q8_0/big-Q8_0-00001-of-00003.gguf", 2 * GB),
    RepoFile("Q8_0/big-Q8_0-00003-of-00003.gguf", GB),
    RepoFile("big-Q4_K_M.gguf", 3 * GB),
]


def paths(choice) -> list[str]:
    return [f.path for f in choice.files]


def test_no_tag_takes_q4_k_m() -> None:
    assert paths(choose(LISTING, "u/r")) == ["model-Q4_K_M.gguf"]


def test_no_q4_k_m_takes_q8_0_else_the_first_model() -> None:
    assert paths(choose([f for f in LISTING if "Q4_K_M" not in f.path], "u/r")) == ["model-Q8_0.gguf"]
    only = [RepoFile("mmproj-x.gguf"), RepoFile("x-Q5_K_M.gguf"), RepoFile("x-Q6_K.gguf")]
    assert paths(choose(only, "u/r")) == ["x-Q5_K_M.gguf"]


@pytest.mark.parametrize(
    ("tag", "expected"),
    [("q4_k_s", "model-Q4_K_S.gguf"), ("Q2_K", "model-Q2_K.gguf"), ("iq4_xs", "model-IQ4_XS.gguf")],
)
def test_tag_matches_case_insensitively(tag: str, expected: str) -> None:
    choice = choose(LISTING, "u/r", quant=tag)
    assert paths(choice) == [expected]
    assert choice.quant == tag.upper()


def test_tag_needs_a_boundary_so_q4_k_is_not_q4_k_m() -> None:
    with pytest.raises(ModelNotFound, match="has no Q4_K file; it offers: Q2_K 3.0 GB, Q4_K_S 4.0 GB"):
        choose(LISTING, "u/r", quant="Q4_K")


def test_an_ambiguous_tag_lists_the_candidates() -> None:
    listing = [RepoFile("a-Q4_0.gguf"), RepoFile("b-Q4_0.gguf")]
    with pytest.raises(
        ModelNotFound, match=r"Q4_0 matches several files in u/r \(a-Q4_0.gguf, b-Q4_0.gguf\)"
    ):
        choose(listing, "u/r", quant="Q4_0")


def test_split_models_take_every_shard_in_order() -> None:
    choice = choose(SPLIT, "u/r", quant="Q8_0")
    assert paths(choice) == [f"Q8_0/big-Q8_0-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert choice.size == 5 * GB


def test_a_missing_shard_is_an_error_not_half_a_model() -> None:
    with pytest.raises(ModelNotFound, match="shard"):
        choose(SPLIT[1:], "u/r", quant="Q8_0")


def test_never_mmproj_imatrix_or_draft() -> None:
    assert not is_model_file("mmproj-model-f16.gguf")
    assert not is_model_file("sub/model.imatrix.gguf")
    assert not is_model_file("model-draft-Q4_0.gguf")
    assert not is_model_file("mtp-model-Q8_0.gguf")
    assert is_model_file("sub/Model-Q4_K_M.GGUF")
    with pytest.raises(ModelNotFound, match="has no GGUF model files"):
        choose([RepoFile("mmproj-f16.gguf"), RepoFile("notes.txt")], "u/r")


def test_exact_file_names_win_and_missing_ones_list_the_offer() -> None:
    assert paths(choose(LISTING, "u/r", file="model-Q8_0.gguf")) == ["model-Q8_0.gguf"]
    with pytest.raises(ModelNotFound, match="has no file nope.gguf; it offers: Q2_K"):
        choose(LISTING, "u/r", file="nope.gguf")


@pytest.mark.parametrize(
    ("path", "quant"),
    [
        ("Llama-3.2-1B-Instruct-Q4_K_M.gguf", "Q4_K_M"),
        ("qwen2.5-0.5b-instruct-fp16.gguf", "FP16"),
        ("gemma-3-1b-it-UD-Q4_K_XL.gguf", "UD-Q4_K_XL"),
        ("Q8_0/x-00001-of-00002.gguf", "Q8_0"),
        ("phi-4-mini-IQ3_XXS.gguf", "IQ3_XXS"),
        ("model.gguf", None),
        ("m-BF16.gguf", "BF16"),
    ],
)
def test_quant_of(path: str, quant: str | None) -> None:
    assert quant_of(path) == quant


def test_split_info() -> None:
    assert split_info("a/b-00002-of-00010.gguf") == ("a/b", 2, 10)
    assert split_info("b-Q4_0.gguf") is None


def test_describe_offer_counts_a_split_model_once() -> None:
    assert describe_offer(SPLIT) == "it offers: Q8_0 5.0 GB, Q4_K_M 3.0 GB"
