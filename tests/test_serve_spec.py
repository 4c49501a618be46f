"""Speculative decoding through `runner serve`, a real server over loopback: each sequence drafts in
the shared batch as `runner run` does, the answer is the one without speculation, and its timings
say what was drafted and kept."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai

from tests.conftest import run_cli
from tests.serving import serving

PARAGRAPH = (
    "The old lighthouse stood on the northern cliff for two hundred years. Every night its keeper "
    "climbed the spiral stairs, trimmed the wick and polished the great lens until it shone. Ships "
    "passing in the dark trusted its beam to guide them past the rocks."
)
COPY = [{"role": "user", "content": f"Repeat the following text exactly.\n\n{PARAGRAPH}"}]


def ask(url: str, n: int = 1) -> list[dict]:
    body = {"model": "smollm2", "messages": COPY, "max_tokens": 48, "temperature": 0, "seed": 1}
    with httpx.Client(base_url=url, timeout=120) as client:
        return [client.post("/v1/chat/completions", json=body).json() for _ in range(n)]


def test_each_sequence_drafts_and_the_answer_is_the_one_without(smollm2_path: Path, tmp_path: Path) -> None:
    args = ["smollm2", "--parallel", "2", "--ctx", "1024", "--threads", "2"]
    with serving([*args, "--spec", "none"], tmp_path / "none.log") as server:
        (plain,) = ask(server.url)
    with serving([*args, "--spec", "ngram"], tmp_path / "ngram.log") as server:
        answers = ask(server.url, 2)  # the second: the costs measured by the first carry over
        streamed = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused").chat.completions.create(
            model="smollm2", messages=COPY, max_tokens=48, temperature=0, seed=1, stream=True
        )
        text = "".join(chunk.choices[0].delta.content or "" for chunk in streamed if chunk.choices)
    assert plain["timings"]["drafted"] == 0 and plain["timings"]["accepted"] == 0
    for answer in answers:
        assert answer["choices"][0]["message"]["content"] == plain["choices"][0]["message"]["content"]
        for count in ("prompt_tokens", "completion_tokens"):  # cached_tokens: the second found its head
            assert answer["usage"][count] == plain["usage"][count]
    drafted = sum(a["timings"]["drafted"] for a in answers)
    accepted = sum(a["timings"]["accepted"] for a in answers)
    assert drafted > 0 and 0 < accepted <= drafted
    assert text == plain["choices"][0]["message"]["content"]


def test_a_bad_spec_for_serve_is_one_line_and_exit_2() -> None:
    done = run_cli("serve", "smollm2", "--spec", "sometimes", "--port", "1")
    assert done.returncode == 2 and done.stdout == b""
    assert done.stderr.decode().strip().splitlines() == [
        "runner: error: --spec must be ngram or none (got 'sometimes'); a draft model is --draft MODEL"
    ]
