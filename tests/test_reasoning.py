"""Reasoning apart from the answer: the splitter on streams cut at every byte, the templates' switches,
and the real model under templates that think (SmolLM2's weights, a reasoning model's template)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from runner.engine.text.reasoning import ANSWER, REASONING, Splitter, opens_reasoning, style_of
from tests.conftest import run_cli

THINKING = (
    "<think>\nThe user wants 2+2. That is 4.\n</think>\n\nThe answer is 4.",
    [(REASONING, "\nThe user wants 2+2. That is 4.\n"), (ANSWER, "The answer is 4.")],
)
HARMONY = (
    "<|channel|>analysis<|message|>Compute 2+2 = 4.<|end|><|start|>assistant<|channel|>final"
    "<|message|>It is 4.",
    [(REASONING, "Compute 2+2 = 4."), (ANSWER, "It is 4.")],
)


def _split(style: str, text: str, cuts: list[int], start_in_reasoning: bool = False) -> list[tuple[str, str]]:
    splitter = Splitter(style, start_in_reasoning)
    parts = []
    last = 0
    for cut in [*cuts, len(text)]:
        parts += splitter.push(text[last:cut])
        last = cut
    parts += splitter.flush()
    merged: list[tuple[str, str]] = []
    for kind, piece in parts:
        if merged and merged[-1][0] == kind:
            merged[-1] = (kind, merged[-1][1] + piece)
        else:
            merged.append((kind, piece))
    return merged


@pytest.mark.fast
@pytest.mark.parametrize("style, case", [("think", THINKING), ("channels", HARMONY)])
def test_every_split_point_gives_the_same_parts(style: str, case: tuple[str, list]) -> None:
    text, expected = case
    assert _split(style, text, []) == expected
    for i in range(1, len(text)):
        assert _split(style, text, [i]) == expected, i
    for i in range(1, len(text) - 1):  # and two cuts, one inside each marker's neighbourhood
        assert _split(style, text, [i, i + 1]) == expected, i
    assert _split(style, text, list(range(1, len(text)))) == expected  # one character at a time


@pytest.mark.fast
def test_a_template_that_opens_the_block_starts_in_reasoning() -> None:
    assert opens_reasoning("<|im_start|>assistant\n<think>\n")
    assert not opens_reasoning("<think>\nold\n</think>\nanswer<|im_start|>assistant\n")
    text = "The sum is 4.\n</think>\nFour."
    assert _split("think", text, [5, 17], start_in_reasoning=True) == [
        (REASONING, "The sum is 4.\n"),
        (ANSWER, "Four."),
    ]


@pytest.mark.fast
def test_text_that_only_looks_like_a_marker_stays_text() -> None:
    assert _split("think", "a < b and <thin ice>", [3, 12]) == [(ANSWER, "a < b and <thin ice>")]
    assert _split("think", "ends with <thi", []) == [(ANSWER, "ends with <thi")]  # flushed at the end
    assert Splitter(None).push("<think>x</think>") == [(ANSWER, "<think>x</think>")]  # no style: as is


@pytest.mark.fast
def test_style_comes_from_the_template() -> None:
    assert style_of(None) is None and style_of("{{ messages }}") is None
    assert style_of("{% if enable_thinking %}<think>{% endif %}") == "think"
    assert style_of("<|start|>assistant<|channel|>final<|message|>") == "channels"


OPENS_THINK = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}{% endif %}"
)


@pytest.fixture(scope="module")
def thinking_model(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2's weights under a Qwen3-like template that opens a <think> block (--no-think closes it)."""
    out = tmp_path_factory.mktemp("think") / "think.gguf"
    done = subprocess.run(
        [sys.executable, "-m", "gguf.scripts.gguf_new_metadata", str(smollm2_path), str(out)]
        + ["--chat-template", OPENS_THINK, "--force"],
        capture_output=True,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    return out


def test_reasoning_goes_to_stderr_and_json_keeps_it_apart(thinking_model: Path) -> None:
    args = [str(thinking_model), "What is 2+2?", "--temperature", "0", "--max-tokens", "24"]
    piped = run_cli("run", *args)
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout == b""  # all 24 tokens were thinking: the answer never began
    assert len(piped.stderr.strip()) > 10  # the reasoning, on stderr
    hidden = run_cli("run", *args, "--hide-reasoning")
    assert hidden.stdout == b"" and hidden.stderr == b""
    data = json.loads(run_cli("run", *args, "--json").stdout)
    assert data["text"] == "" and data["reasoning"] == piped.stderr.decode().strip()


def test_no_think_reaches_the_template(thinking_model: Path) -> None:
    done = run_cli(
        "run", str(thinking_model), "What is 2+2?", "--temperature", "0", "--max-tokens", "12", "--no-think"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() and done.stderr == b""  # the block came closed: all of it is answer


def test_earlier_reasoning_is_not_sent_back(thinking_model: Path) -> None:
    """A chat keeps each answer's reasoning in the store, and sends only the answers back."""
    from runner.engine.conversation import fit
    from runner.engine.engine import Engine
    from runner.engine.text.template import Message
    from runner.gguf import read_header

    header = read_header(thinking_model)
    with Engine(thinking_model, n_ctx=1024, n_threads=2) as engine:
        turns = [Message("user", "Hi"), Message("assistant", "Hello!"), Message("user", "2+2?")]
        fitted = fit(engine, header, "Be brief.", turns)
    assert "Hello!<|im_end|>" in fitted.prompt.text and "<think>\nHello" not in fitted.prompt.text
    assert fitted.prompt.opens_reasoning and fitted.prompt.reasoning_style == "think"


def test_chat_stores_reasoning_apart(thinking_model: Path) -> None:
    from runner.store import Store

    done = run_cli(
        "chat", str(thinking_model), "--max-tokens", "16", "--temperature", "0", input=b"What is 2+2?\n"
    )
    assert done.returncode == 0, done.stderr
    store = Store.open()
    try:
        conversation = store.load(store.latest() or 0)
    finally:
        store.close()
    assert conversation is not None
    answer = conversation.messages[-1]
    assert answer.role == "assistant" and answer.content == "" and answer.reasoning


def test_the_server_keeps_reasoning_apart(thinking_model: Path, tmp_path: Path) -> None:
    """runner serve: the OpenAI API's reasoning_content, Ollama's thinking, Anthropic's thinking block
    and a Responses reasoning item carry the same reasoning, the answer's content the rest;
    enable_thinking off (chat_template_kwargs, Ollama's think) closes it."""
    import anthropic
    import ollama
    import openai

    from tests.serving import serving

    name, question = thinking_model.stem, [{"role": "user", "content": "What is 2+2?"}]  # a file's stem
    with serving([str(thinking_model), "--parallel", "1", "--ctx", "1024"], tmp_path / "stderr") as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
        thought = client.chat.completions.create(model=name, messages=question, max_tokens=24, temperature=0)
        message = thought.choices[0].message
        assert message.content in ("", None) and len(message.model_extra["reasoning_content"]) > 10
        plain = client.chat.completions.create(
            model=name,
            messages=question,
            max_tokens=12,
            temperature=0,
            extra_body={"chat_template_kwargs": {"enable_thinking": False}},
        )
        assert plain.choices[0].message.content and not plain.choices[0].message.model_extra.get(
            "reasoning_content"
        )
        reply = ollama.Client(host=server.url).chat(
            model=name, messages=question, think=True, options={"num_predict": 24, "temperature": 0}
        )
        assert (
            reply.message.thinking == message.model_extra["reasoning_content"] and not reply.message.content
        )
        # every API the same reasoning, split in the one loop: Anthropic's thinking block, a Responses
        # reasoning item
        reasoned = anthropic.Anthropic(base_url=server.url, api_key="unused").messages.create(
            model=name, messages=question, max_tokens=24, extra_body={"temperature": 0}
        )
        blocks = {block.type: block for block in reasoned.content}
        assert blocks["thinking"].thinking == message.model_extra["reasoning_content"]
        assert "text" not in blocks or not blocks["text"].text
        response = client.responses.create(model=name, input=question, max_output_tokens=24, temperature=0)
        items = {item.type: item for item in response.output}
        texts = [part.text for part in items["reasoning"].content or []]
        assert "".join(texts) == message.model_extra["reasoning_content"] and not response.output_text


def test_each_line_keeps_reasoning_apart_as_run_does(thinking_model: Path) -> None:
    """--each-line answers through the same loop as run: the same reasoning, apart from the answer
    (--jsonl carries it in its own field; the plain line is the answer alone)."""
    args = [str(thinking_model), "--temperature", "0", "--max-tokens", "24"]
    one = json.loads(run_cli("run", *args, "What is 2+2?", "--json").stdout)
    batch = run_cli("run", *args, "--each-line", "--jsonl", input=b"What is 2+2?\nWhat is 3+3?\n")
    assert batch.returncode == 0, batch.stderr
    first = json.loads(batch.stdout.decode().splitlines()[0])
    assert first["reasoning"] == one["reasoning"] and len(one["reasoning"]) > 10
    assert first["text"] == one["text"] == ""
    plain = run_cli("run", *args, "--each-line", input=b"What is 2+2?\n")
    assert plain.returncode == 0 and plain.stdout == b"\n"  # all thinking: an empty answer line


# gpt-oss's harmony format from a model that really emits it: a scripted model (tests/synth.py) on
# SmolLM2's tokenizer, its unused control tokens renamed to harmony's markers, whose greedy answer is
# analysis, then final, then <|return|>. The pinned llama.cpp treats these markers as gpt-oss's (its
# vocabulary load finds them by text): <|end|> is no end of generation, <|return|> is.
HARMONY_MARKERS = {
    3: "<|channel|>",
    4: "<|message|>",
    5: "<|end|>",
    6: "<|start|>",
    7: "<|return|>",
    8: "<|call|>",
    9: "<|constrain|>",
}
HARMONY_TEMPLATE = (
    "{% for m in messages %}<|start|>{{ m.role }}"
    "{% if m.role == 'assistant' %}<|channel|>final{% endif %}<|message|>{{ m.content }}<|return|>"
    "{% endfor %}{% if add_generation_prompt %}<|start|>assistant{% endif %}"
)
REASONED, ANSWERED = "Two and two make four.", "It is 4!"


@pytest.fixture(scope="module")
def harmony_model(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    import llama_cpp

    from tests.synth import write_scripted

    vocab = llama_cpp.Llama(str(smollm2_path), vocab_only=True, verbose=False)

    def tokens(text: str) -> list[int]:
        return vocab.tokenize(text.encode(), add_bos=False, special=False)

    channel, message, end, start, ret = 3, 4, 5, 6, 7
    assistant = tokens("assistant")  # the generation prompt's last tokens, and the second header's
    script = [assistant[-1], channel, *tokens("analysis"), message, *tokens(REASONED), end, start]
    script += [*assistant, channel, *tokens("final"), message, *tokens(ANSWERED), ret]
    out = tmp_path_factory.mktemp("harmony") / "harmony.gguf"
    return write_scripted(
        out, smollm2_path, script, once=end, edits=HARMONY_MARKERS, template=HARMONY_TEMPLATE
    )


def test_a_harmony_answer_is_split_the_same_by_run_each_line_and_chat(harmony_model: Path) -> None:
    """The scripted model answers "<|channel|>analysis<|message|>R<|end|><|start|>assistant
    <|channel|>final<|message|>A<|return|>": run, --each-line and chat keep R apart from A."""
    from runner.store import Store

    args = [str(harmony_model), "--temperature", "0", "--max-tokens", "64"]
    one = run_cli("run", *args, "What is 2+2?", "--json")
    assert one.returncode == 0, one.stderr
    data = json.loads(one.stdout)
    assert (data["reasoning"], data["text"], data["finish_reason"]) == (REASONED, ANSWERED, "stop")
    piped = run_cli("run", *args, "What is 2+2?")
    assert piped.stdout.decode().strip() == ANSWERED and REASONED in piped.stderr.decode()
    batch = run_cli("run", *args, "--each-line", "--jsonl", input=b"What is 2+2?\nAnd 3+3?\n")
    assert batch.returncode == 0, batch.stderr
    for line in batch.stdout.decode().splitlines():
        row = json.loads(line)
        assert (row["reasoning"], row["text"]) == (REASONED, ANSWERED)
    chat = run_cli("chat", *args, input=b"What is 2+2?\n")
    assert chat.returncode == 0, chat.stderr
    assert chat.stdout.decode().strip() == ANSWERED
    store = Store.open()
    try:
        conversation = store.load(store.latest() or 0)
    finally:
        store.close()
    assert conversation is not None
    answer = conversation.messages[-1]
    assert (answer.role, answer.content, answer.reasoning) == ("assistant", ANSWERED, REASONED)


def test_a_harmony_answer_is_split_the_same_by_every_api(harmony_model: Path, tmp_path: Path) -> None:
    """runner serve: OpenAI's reasoning_content (whole and streamed), Ollama's thinking, Anthropic's
    thinking block and a Responses reasoning item carry R, the answer's text A."""
    import anthropic
    import ollama
    import openai

    from tests.serving import serving

    name, question = harmony_model.stem, [{"role": "user", "content": "What is 2+2?"}]
    with serving([str(harmony_model), "--parallel", "2", "--ctx", "1024"], tmp_path / "stderr") as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
        whole = client.chat.completions.create(model=name, messages=question, max_tokens=64, temperature=0)
        message = whole.choices[0].message
        assert (message.model_extra["reasoning_content"], message.content) == (REASONED, ANSWERED)
        assert whole.choices[0].finish_reason == "stop"
        reasoning, content = "", ""
        for chunk in client.chat.completions.create(
            model=name, messages=question, max_tokens=64, temperature=0, stream=True
        ):
            if chunk.choices:
                delta = chunk.choices[0].delta
                reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
                content += delta.content or ""
        assert (reasoning, content) == (REASONED, ANSWERED)
        reply = ollama.Client(host=server.url).chat(
            model=name, messages=question, think=True, options={"num_predict": 64, "temperature": 0}
        )
        assert (reply.message.thinking, reply.message.content) == (REASONED, ANSWERED)
        assert reply.done_reason == "stop"
        reasoned = anthropic.Anthropic(base_url=server.url, api_key="unused").messages.create(
            model=name, messages=question, max_tokens=64, extra_body={"temperature": 0}
        )
        blocks = {block.type: block for block in reasoned.content}
        assert (blocks["thinking"].thinking, blocks["text"].text) == (REASONED, ANSWERED)
        assert reasoned.stop_reason == "end_turn"
        response = client.responses.create(model=name, input=question, max_output_tokens=64, temperature=0)
        items = {item.type: item for item in response.output}
        texts = [part.text for part in items["reasoning"].content or []]
        assert ("".join(texts), response.output_text) == (REASONED, ANSWERED)


def test_every_api_bounds_the_thinking_and_says_its_tokens(thinking_model: Path, tmp_path: Path) -> None:
    """runner serve honours each API's own field for how long a model thinks: llama-server's
    reasoning_budget_tokens and OpenAI's reasoning_effort, Anthropic's thinking.budget_tokens, Ollama's
    think level, Responses' reasoning.effort. The model here never ends its thinking by itself (its
    template opened a <think> block, SmolLM2 never closes it): an answer comes only where a budget
    closed it. A value the API does not have is a 400 naming the field."""
    import anthropic
    import ollama
    import openai

    from tests.serving import serving

    think = "What is 2 + 2? Think step by step."  # SmolLM2 thinks past 60 tokens on this one
    name, question = thinking_model.stem, [{"role": "user", "content": think}]
    with serving([str(thinking_model), "--parallel", "1", "--ctx", "2048"], tmp_path / "stderr") as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
        asked = dict(model=name, messages=question, max_tokens=60, temperature=0)
        free = client.chat.completions.create(**asked)  # type: ignore[call-overload]
        assert not free.choices[0].message.content
        assert free.usage.completion_tokens_details.reasoning_tokens == 60
        bounded = client.chat.completions.create(**asked, extra_body={"reasoning_budget_tokens": 8})  # type: ignore[call-overload]
        assert bounded.choices[0].message.content  # the budget closed the thinking: an answer came
        assert 8 <= bounded.usage.completion_tokens_details.reasoning_tokens < 60
        off = client.chat.completions.create(**asked, reasoning_effort="none")  # type: ignore[call-overload]
        assert off.choices[0].message.content  # its template's switch, enable_thinking false
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(**asked, reasoning_effort="extreme")  # type: ignore[call-overload]
        assert refused.value.body["param"] == "reasoning_effort"  # type: ignore[index]
        reply = anthropic.Anthropic(base_url=server.url, api_key="unused").messages.create(
            model=name,
            messages=question,  # type: ignore[arg-type]
            max_tokens=60,
            thinking={"type": "enabled", "budget_tokens": 8},
            extra_body={"temperature": 0},
        )
        blocks = {block.type: block for block in reply.content}
        assert blocks["thinking"].thinking and blocks["text"].text  # type: ignore[union-attr]
        thought = ollama.Client(host=server.url).chat(
            model=name, messages=question, think="low", options={"num_predict": 60, "temperature": 0}
        )
        assert thought.message.thinking and not thought.message.content  # low: 256 tokens, more than 60
        response = client.responses.create(
            model=name, input=question, max_output_tokens=60, temperature=0, reasoning={"effort": "none"}
        )
        assert response.output_text
        thinking = client.responses.create(model=name, input=question, max_output_tokens=60, temperature=0)
        assert thinking.usage is not None and thinking.usage.output_tokens_details.reasoning_tokens == 60


def test_run_and_chat_take_a_think_level_and_a_budget(thinking_model: Path) -> None:
    """--reasoning-budget N closes the thinking after N tokens (an answer comes); --think off reaches the
    template's own switch; a level its template cannot say becomes a budget; /set think LEVEL too."""
    asked = ("run", str(thinking_model), "What is 2 + 2? Think step by step.", "--max-tokens", "60")
    asked += ("--temperature", "0", "--json")
    free = json.loads(run_cli(*asked).stdout)
    assert not free["text"] and free["reasoning"]  # it never ends its thinking by itself
    bounded = json.loads(run_cli(*asked, "--reasoning-budget", "8").stdout)
    assert bounded["text"] and "thinking budget" in bounded["reasoning"]
    off = json.loads(run_cli(*asked, "--think", "off").stdout)
    assert off["text"] and not off.get("reasoning")  # enable_thinking false: the template closed it
    low = json.loads(run_cli(*asked, "--think", "low").stdout)
    assert not low["text"]  # low on this template: a budget of 256 tokens, more than these 60
    chat = run_cli(
        "chat", str(thinking_model), "--max-tokens", "60", "--temperature", "0", "--reasoning-budget", "8",
        input=b"What is 2 + 2? Think step by step.\n/set think off\n/show\n/think medium\n/show\n",
    )  # fmt: skip
    assert chat.returncode == 0 and chat.stdout.strip(), chat.stderr
    assert b"think off" in chat.stderr and b"think medium" in chat.stderr


def test_thinking_asked_of_a_model_without_it_is_said_once_never_refused() -> None:
    """SmolLM2's template has no thinking: --think high is said on stderr (once), and the answer comes;
    --think off asks nothing it cannot do, and says nothing."""
    asked = ("run", "smollm2", "Hi", "--max-tokens", "2", "--temperature", "0")
    high = run_cli(*asked, "--think", "high")
    assert high.returncode == 0 and high.stdout.strip(), high.stderr
    assert high.stderr.count(b"does not think") == 1
    off = run_cli(*asked, "--think", "off")
    assert off.returncode == 0 and b"does not think" not in off.stderr


def test_a_budget_closes_a_harmony_models_analysis_and_its_final_answer_follows(harmony_model: Path) -> None:
    """gpt-oss's style: a budget of 2 keeps two tokens of the analysis message (its header's
    <|channel|>analysis<|message|> not counted), then the note and the switch to the final channel
    are forced, and the scripted model answers there."""
    args = ["run", str(harmony_model), "What is 2+2?", "--temperature", "0", "--max-tokens", "64", "--json"]
    free = json.loads(run_cli(*args).stdout)
    bounded = json.loads(run_cli(*args, "--reasoning-budget", "2").stdout)
    assert (free["reasoning"], free["text"]) == (REASONED, ANSWERED)
    assert bounded["text"] == ANSWERED and bounded["reasoning"].startswith("Two and\n\n")
    assert "thinking budget" in bounded["reasoning"] and REASONED not in bounded["reasoning"]
    assert free["timings"]["reasoning_tokens"] > 0 and bounded["timings"]["reasoning_tokens"] > 2
