"""docs/serve.md's examples, run: its curl command and its Python blocks (the `openai` and `ollama`
clients) against a real `runner serve` of the test model, on a free port in place of 8080."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.serving import serving

PAGE = (Path(__file__).resolve().parent.parent / "docs" / "serve.md").read_text()
DOC_ADDRESS = "127.0.0.1:8080"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", PAGE, re.DOTALL)


@pytest.fixture(scope="module")
def address(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("serve") / "stderr"
    with serving(["smollm2", "--parallel", "2"], log) as server:
        yield server.address


@pytest.mark.fast
def test_the_page_has_a_curl_an_openai_and_an_ollama_example() -> None:
    python = "\n".join(blocks("python"))
    assert any(line.startswith("curl ") for block in blocks("sh") for line in block.splitlines())
    assert "from openai import OpenAI" in python and "from ollama import Client" in python
    assert all(DOC_ADDRESS in block for block in blocks("python"))


def test_the_curl_example_answers(address: str) -> None:
    for line in (ln for block in blocks("sh") for ln in block.splitlines() if ln.startswith("curl ")):
        done = subprocess.run(
            line.replace(DOC_ADDRESS, address), shell=True, capture_output=True, timeout=60, check=True
        )
        answer = httpx.Response(200, content=done.stdout).json()
        assert answer["object"] == "chat.completion" and answer["choices"][0]["message"]["content"]


@pytest.mark.parametrize("index", range(len(blocks("python"))))
def test_each_python_example_runs(address: str, index: int) -> None:
    code = blocks("python")[index].replace(DOC_ADDRESS, address)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, timeout=120, env={**os.environ}, check=False
    )
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.strip(), "the example printed nothing"
