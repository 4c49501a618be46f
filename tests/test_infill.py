"""Fill-in-the-middle: the prompt laid out as the pinned llama-server's /infill lays it, token for token
(its format_prompt_infill, tools/server/server-common.cpp), on SmolLM2 given FIM tokens (its own
vocabulary has none: three of its unused control tokens are named fim_pre/suf/mid in a copy's GGUF);
/infill in llama-server's shape, streamed and whole; `suffix` on /v1/completions and /api/generate;
`runner run --suffix`; a model without FIM tokens refused in each API's shape and with exit 2; cached
runs moved into place across keystrokes (llama-server's --cache-reuse). The live comparison with
llama-server runs where its binary is (LLAMA_SERVER, or the peers' build), and skips cleanly elsewhere;
what it answered for two requests is recorded below and checked everywhere.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import openai
import pytest
from serving import THREADS, free_port, serving

from runner.engine.reuse import chunk_moves, reusable
from runner.engine.text.fim import Chunk, FimTokens, Infill, infill_tokens
from tests.conftest import run_cli
from tests.synth import with_fim

FIM_IDS = {"fim_pre": 8, "fim_suf": 9, "fim_mid": 10, "fim_pad": 16, "fim_rep": 3, "fim_sep": 5}
LLAMA_SERVER = Path(os.environ.get("LLAMA_SERVER", "/tmp/peers/build/bin/llama-server"))
CTX = 4096

ADD = {  # what llama.vim sends, in small: the other file, the code around the cursor
    "input_prefix": "def add(a, b):\n    ",
    "input_suffix": "\n\nprint(add(1, 2))\n",
    "input_extra": [{"filename": "x.py", "text": "import os\n"}],
}
# llama-server (the pinned build, -c 4096 -np 1) for ADD with n_predict 16, temperature 0: its prompt
# as it writes it back, its length, and the greedy answer
SERVER_ADD = {
    "prompt": "<repo_name>myproject\n<file_sep>x.py\nimport os\n<file_sep>filename\n"
    "<issue_start>def add(a, b):\n    <issue_comment>\n\nprint(add(1, 2))\n<issue_closed>",
    "tokens_evaluated": 38,
    "content": "\n",
}
SERVER_BARE = {  # prefix "def add(a, b):\n    ", suffix "\n", nothing else
    "prompt": "<repo_name>myproject\n<file_sep>filename\n"
    "<issue_start>def add(a, b):\n    <issue_comment>\n<issue_closed>",
    "tokens_evaluated": 19,
}


@pytest.fixture(scope="module")
def fim_path(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return with_fim(smollm2_path, tmp_path_factory.mktemp("fim") / "smollm2-fim.gguf", FIM_IDS)


# -- the layout, by hand -------------------------------------------------------------------------------


def letters(text: str) -> list[int]:
    """A tokenizer of one token per character (its code), for layouts checked by hand."""
    return [ord(c) for c in text]


REPO = FimTokens(pre=1002, suf=1003, mid=1004, rep=1005, sep=1006)


def test_the_repo_level_layout_is_llama_servers() -> None:
    infill = Infill("ab", "cd", (Chunk("X", "f"),), prompt="")
    got = infill_tokens(REPO, letters, infill, letters("p"), n_ctx=4096, bos=1)
    extra = [
        1005,
        *letters("myproject\n"),
        1006,
        *letters("f\n"),
        *letters("X"),
        1006,
        *letters("filename\n"),
    ]
    assert got == [*extra, 1, 1002, *letters("ab"), *letters("p"), 1003, *letters("cd"), 1004]


def test_without_fim_sep_each_chunk_follows_a_snippet_line() -> None:
    plain = FimTokens(pre=1002, suf=1003, mid=1004)
    got = infill_tokens(plain, letters, Infill("a", "b", (Chunk("X"), Chunk("Y"))), [], n_ctx=4096, bos=None)
    snippet = letters("\n\n--- snippet ---\n\n")
    assert got == [
        *snippet,
        *letters("X"),
        *snippet,
        *letters("Y"),
        1002,
        *letters("a"),
        1003,
        *letters("b"),
        1004,
    ]


def test_what_fits_is_the_prefixs_end_the_suffixs_start_and_the_extras_end() -> None:
    prefix, suffix, extra = "p" * 2000, "s" * 600, "e" * 5000
    got = infill_tokens(
        REPO, letters, Infill(prefix, suffix, (Chunk(extra),)), letters("xy"), n_ctx=4096, bos=None
    )
    # 3/4 of llama-server's 2048 batch for the prefix, 1/4 less the prompt and 2 for the suffix, and
    # what the context has past a batch (+2: its n_predict is -1) for the extra chunks, from their end
    pre = got.index(1002)
    assert pre == 4096 - 2048 + 2 and got[:pre] == [*letters("e" * (pre - 10)), 1006, *letters("filename\n")]
    assert got[pre:].count(ord("p")) == 1536 and got[pre:].count(ord("s")) == 512 - 4
    assert got[-1] == 1004 and got[pre + 1 + 1536 : pre + 1 + 1538] == letters("xy")


def test_a_mixed_prefix_keeps_its_token_ids() -> None:
    got = infill_tokens(REPO, letters, Infill(["a", 77, "b"], "c"), [], n_ctx=2048, bos=None)
    assert got[got.index(1002) :] == [1002, ord("a"), 77, ord("b"), 1003, ord("c"), 1004]


def test_missing_tokens_are_named() -> None:
    assert FimTokens(pre=1, suf=-1, mid=-1).missing == ["suffix", "middle"]
    assert FimTokens(pre=1, suf=2, mid=3).missing == []


# -- cached runs moved into place, by hand ---------------------------------------------------------------


def test_a_run_is_moved_where_the_new_prompt_wants_it() -> None:
    cached = [1, 2, 10, 11, 12, 13, 14, 15, 9, 9]
    prompt = [1, 2, 11, 12, 13, 14, 15, 7]  # 10 dropped: the prefix's start moved on
    end, moves = chunk_moves(cached, prompt, 2, least=3)
    assert (end, moves) == (7, [(3, 2, 5)])
    assert reusable(cached, prompt, 3, most=len(prompt) - 1) == 7
    assert reusable(cached, prompt, 6, most=len(prompt) - 1) == 2  # no run that long: the head alone
    assert reusable([1, 2, -7, 3], [1, 2, -7, 3, 4], 1, most=4) == 4  # an image: the head alone, as it is


def test_the_engine_moves_runs_and_answers_as_a_cold_prompt(engine: Any) -> None:
    from runner.engine.loop import Loop
    from runner.engine.request import bare, to_job
    from runner.engine.text.sampling import SamplingConfig

    code = "".join(f"def f{i}(x):\n    return x * {i} + {i * 7 % 13}\n" for i in range(40))
    first = engine.model.tokenize(code)
    second = first[:2] + first[9:] + engine.model.tokenize("\ndef g(", add_special=False)
    greedy = SamplingConfig(temperature=0)
    done: list[Any] = []
    engine.context.reset()
    loop = Loop(engine, done.append)

    def answer(tokens: list[int], least: int) -> Any:
        loop.add(to_job(bare(tokens, greedy, max_tokens=8, reuse_chunks=least), len(done)))
        while loop.busy():
            loop.step()
        return done[-1]

    try:
        answer(first, 256)
        moved = answer(second, 256)
        assert moved.timings.prefill_tokens <= 8, moved.timings  # the new tail alone, the rest moved
        engine.context.forget(0)
        cold = answer(second, 0)
        assert cold.timings.prefill_tokens == len(second)
        assert moved.text == cold.text
    finally:
        loop.close()
        engine.context.reset()


# -- runner's prompt is llama-server's -----------------------------------------------------------------


def test_the_prompt_is_the_one_llama_server_wrote_back(fim_path: Path) -> None:
    from runner.engine.infill import infill_prompt
    from runner.engine.vocab import open_vocab

    vocab = open_vocab(fim_path)
    try:
        for body, recorded in (
            (ADD, SERVER_ADD),
            ({"input_prefix": ADD["input_prefix"], "input_suffix": "\n"}, SERVER_BARE),
        ):
            extra = tuple(Chunk(**c) for c in body.get("input_extra", ()))
            tokens = infill_prompt(
                vocab, Infill(body["input_prefix"], body["input_suffix"], extra), CTX, "m"
            ).tokens
            text = b"".join(vocab.token_bytes(t, special=True) for t in tokens).decode()
            assert (text, len(tokens)) == (recorded["prompt"], recorded["tokens_evaluated"])
    finally:
        vocab.close()


@pytest.fixture(scope="module")
def runner_server(
    fim_path: Path, smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    """runner serve of the FIM copy (first: the default) and of SmolLM2 as it is (no FIM tokens)."""
    log = tmp_path_factory.mktemp("infill-serve") / "serve.log"
    args = [str(fim_path), str(smollm2_path), "--ctx", str(CTX), "--parallel", "1", *THREADS]
    with serving(args, log) as server:
        yield server


@pytest.fixture(scope="module")
def http(runner_server: Any) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=runner_server.url, timeout=300) as client:
        yield client


def test_infill_answers_in_llama_servers_shape_as_it_answered(http: httpx.Client) -> None:
    got = http.post("/infill", json={**ADD, "n_predict": 16, "temperature": 0, "return_tokens": True})
    assert got.status_code == 200, got.text
    body = got.json()
    assert (
        body["prompt"] == SERVER_ADD["prompt"] and body["tokens_evaluated"] == SERVER_ADD["tokens_evaluated"]
    )
    assert body["content"] == SERVER_ADD["content"] and body["stop"] is True and body["stop_type"] == "eos"
    assert body["tokens"] == [198]  # "\n" (llama-server lists the end token after it too)
    assert {"prompt_n", "prompt_ms", "predicted_n", "predicted_per_second", "cache_n"} <= set(body["timings"])


def test_response_fields_pick_the_answers_fields_by_path(http: httpx.Client) -> None:
    fields = ["content", "timings/prompt_n", "timings/nothing", "tokens_evaluated"]
    got = http.post(
        "/infill", json={**ADD, "n_predict": 2, "temperature": 0, "response_fields": fields}
    ).json()
    assert set(got) == {"content", "timings/prompt_n", "tokens_evaluated"}, got
    assert got["tokens_evaluated"] == SERVER_ADD["tokens_evaluated"]


def test_infill_streams_pieces_then_the_whole_answer(http: httpx.Client) -> None:
    whole = http.post("/infill", json={**ADD, "input_suffix": "\n", "n_predict": 6, "temperature": 0}).json()
    with http.stream(
        "POST",
        "/infill",
        json={**ADD, "input_suffix": "\n", "n_predict": 6, "temperature": 0, "stream": True},
    ) as got:
        events = [json.loads(line[6:]) for line in got.iter_lines() if line.startswith("data: ")]
    assert [e["stop"] for e in events] == [False] * (len(events) - 1) + [True]
    assert "".join(e["content"] for e in events) == whole["content"]
    assert events[-1]["tokens_predicted"] == whole["tokens_predicted"] == 6


def test_suffix_on_completions_and_generate_is_the_same_infill(
    http: httpx.Client, runner_server: Any
) -> None:
    asked = {"input_prefix": "def add(a, b):\n    ", "input_suffix": "\n", "n_predict": 8, "temperature": 0}
    infilled = http.post("/infill", json=asked).json()["content"]
    client = openai.OpenAI(base_url=f"{runner_server.url}/v1", api_key="x", max_retries=0)
    completed = client.completions.create(
        model="smollm2-fim", prompt=asked["input_prefix"], suffix="\n", max_tokens=8, temperature=0
    )
    assert completed.choices[0].text == infilled
    generated = ollama.Client(host=runner_server.url).generate(
        model="smollm2-fim",
        prompt=asked["input_prefix"],
        suffix="\n",
        options={"num_predict": 8, "temperature": 0},
    )
    assert generated.response == infilled


def test_a_model_without_fim_tokens_is_refused_in_each_apis_shape(
    http: httpx.Client, runner_server: Any
) -> None:
    says = "SmolLM2-135M-Instruct.Q4_1 cannot fill in the middle"
    got = http.post("/infill", json={**ADD, "model": "SmolLM2-135M-Instruct.Q4_1"})
    assert got.status_code == 400 and says in got.json()["error"]["message"], got.text
    client = openai.OpenAI(base_url=f"{runner_server.url}/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError, match=says):
        client.completions.create(
            model="SmolLM2-135M-Instruct.Q4_1", prompt="def f(", suffix=")", max_tokens=4
        )
    with pytest.raises(ollama.ResponseError, match=says) as refused:
        ollama.Client(host=runner_server.url).generate(
            model="SmolLM2-135M-Instruct.Q4_1", prompt="def f(", suffix=")"
        )
    assert refused.value.status_code == 400


def test_a_token_id_the_model_lacks_is_a_400_never_a_crash(http: httpx.Client) -> None:
    """A mixed prefix's ids go to llama.cpp's token_to_piece: one past the vocabulary is refused first."""
    for bad in (99999999, -1, 2**40):
        body = {"input_prefix": ["def f(", bad], "input_suffix": ")", "n_predict": 1}
        got = http.post("/infill", json=body)
        assert got.status_code == 400 and got.json()["error"]["param"] == "input_prefix", got.text
    assert http.post("/infill", json={**ADD, "n_predict": 1}).status_code == 200  # still serving


def test_a_grown_prefix_reuses_what_the_last_keystroke_evaluated(http: httpx.Client) -> None:
    prefix = "".join(f"x{i} = {i}\n" for i in range(60))
    asked = {"input_suffix": "print(x)\n", "n_predict": 2, "temperature": 0}
    first = http.post("/infill", json={**asked, "input_prefix": prefix}).json()
    grown = http.post("/infill", json={**asked, "input_prefix": prefix + "y = "}).json()
    assert grown["timings"]["cache_n"] >= first["tokens_evaluated"] - 12, grown["timings"]
    assert grown["timings"]["prompt_n"] <= 12, grown["timings"]  # the new characters, the suffix, its marks


def test_run_suffix_fills_in_and_a_model_without_fim_tokens_exits_2(
    fim_path: Path, smollm2_path: Path
) -> None:
    done = run_cli(
        "run", str(fim_path), ADD["input_prefix"], "--suffix", "\n", "--temperature", "0", "--max-tokens", "8"
    )
    assert done.returncode == 0, done.stderr
    refused = run_cli("run", str(smollm2_path), "def f(", "--suffix", ")")
    assert refused.returncode == 2 and refused.stdout == b""
    assert b"cannot fill in the middle" in refused.stderr and b"Traceback" not in refused.stderr


# -- live, beside llama-server ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama_server(fim_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if not LLAMA_SERVER.is_file():
        pytest.skip(f"no llama-server at {LLAMA_SERVER} (LLAMA_SERVER names another)")
    port, log = free_port(), tmp_path_factory.mktemp("llama-server") / "log"
    command = [str(LLAMA_SERVER), "-m", str(fim_path), "-c", str(CTX), "-np", "1", "-t", "1"]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*command, "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, log.read_text()
            import time

            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def beside(fim_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    """A runner serve of its own for the comparison: asked the same requests in the same order as
    llama-server, its cache holds what llama-server's holds (a head kept from another request can
    move a near tie)."""
    log = tmp_path_factory.mktemp("infill-beside") / "serve.log"
    args = [str(fim_path), "--ctx", str(CTX), "--parallel", "1", *THREADS]
    with serving(args, log) as server, httpx.Client(base_url=server.url, timeout=600) as client:
        yield client


LONG = {  # past what llama-server keeps of each part: its prefix cut at the front, its suffix at the end
    "input_prefix": "".join(f"def f{i}(x):\n    return x * {i}\n" for i in range(130)),
    "input_suffix": "".join(f"# {i}: {i * 3}\n" for i in range(140)),
    "input_extra": [{"filename": "a.py", "text": "A = 1\n"}, {"text": "B = 2\n"}],
    "prompt": "    ",
}


@pytest.mark.parametrize(
    "body",
    [ADD, LONG, {"input_prefix": ["x = ", 28120, "\n"], "input_suffix": ""}],
    ids=["add", "long", "mixed"],
)
def test_the_prompt_and_greedy_answer_are_llama_servers(
    body: dict[str, Any], llama_server: str, beside: httpx.Client
) -> None:
    asked = {**body, "n_predict": 8, "temperature": 0}
    theirs = httpx.post(f"{llama_server}/infill", json=asked, timeout=600).json()
    ours = beside.post("/infill", json=asked).json()
    assert ours["prompt"] == theirs["prompt"]
    assert ours["tokens_evaluated"] == theirs["tokens_evaluated"]
    assert ours["content"] == theirs["content"]
