"""Images on an M-RoPE model (Qwen2-VL's positions), through the one loop: the test projector (scripts/
make_test_projector.py --type qwen2vl, random weights) on SmolLM2 written as a qwen2vl model
(--mrope-out). An image of nx x ny tokens takes max(nx, ny) positions, so positions run apart from
cells (runner.engine.positions). Held against libmtmd's own evaluation (mtmd_helper_eval_chunks, which
tracks n_past itself, as llama-server does) on the same context: the same next position, the same
last position in the KV cache, the same logits; a 5-turn conversation that re-sends the image
evaluates only each turn's new text and agrees with libmtmd's turn 1 followed by each turn's text at
the positions libmtmd's count gives; a batch of sequences each with its own image gives each one's
answer alone; `runner run --image` and `runner serve` (5 turns, the openai client) take the image.
Token for token against llama-server: scripts/bench_vision.py --projector qwen2vl."""

from __future__ import annotations

import base64
import ctypes
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from runner.engine.batch import run_batch
from runner.engine.cells import add_tokens, common_prefix
from runner.engine.engine import Engine
from runner.engine.llamacpp import llama
from runner.engine.prompt import Prompt, render_prompt
from runner.engine.request import Request
from runner.engine.text.sampling import SamplingConfig
from runner.engine.text.template import Message
from runner.engine.vision import mtmd
from runner.gguf import read_header
from runner.images import Image, load_image
from tests.conftest import run_cli
from tests.helpers import random_png as png
from tests.serving import model_server, openai_client

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "make_test_projector.py"
GREEDY = SamplingConfig(temperature=0)
SQUARE = (112, 112)  # 4 x 4 tokens over 4 positions
WIDE = (224, 112)  # 8 x 4 tokens over 8 positions


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("mrope")
    projector, model = folder / "qwen2vl.gguf", folder / "model.gguf"
    subprocess.run(
        [sys.executable, str(SCRIPT), str(projector), "--for", str(smollm2_path), "--type", "qwen2vl",
         "--mrope-out", str(model)],
        check=True, capture_output=True,
    )  # fmt: skip
    return projector, model


@pytest.fixture(scope="module")
def engine(qwen: tuple[Path, Path]):
    projector, model = qwen
    with Engine(model, n_ctx=4096, n_threads=2, n_seq=4) as made:
        made.attach_projector(projector)
        yield made


def conversation(turns: int) -> list[Message]:
    """A chat that sends its image in the first turn and re-sends the whole history each turn."""
    messages = []
    for i in range(turns):
        messages.append(Message("user", f"Question {i}: what colour is corner {i}?"))
        if i < turns - 1:
            messages.append(Message("assistant", f"Answer {i}: blue, mostly."))
    return messages


def prompt_for(
    engine: Engine, model: Path, messages: list[Message], images: list[bytes]
) -> tuple[Prompt, str]:
    pixels = [load_image(b, name="t") for b in images]
    first = Message(messages[0].role, engine.vision.marker * len(images) + messages[0].content)
    rendered = render_prompt(engine, read_header(model), [first, *messages[1:]], images=pixels)
    return rendered, rendered.text


def libmtmd_eval(engine: Engine, text: str, images: list[Image], seq: int) -> int:
    """The prompt evaluated by libmtmd's own helper into sequence `seq` from position 0; its n_past."""
    lib = mtmd()
    bitmaps = (lib.mtmd_bitmap_p_ctypes * len(images))()
    keep = []
    for i, image in enumerate(images):
        data = (ctypes.c_uint8 * len(image.rgb)).from_buffer_copy(image.rgb)
        keep.append(data)
        bitmaps[i] = lib.mtmd_bitmap_init(image.width, image.height, data)
        lib.mtmd_bitmap_set_id(bitmaps[i], image.sha256.encode())
    encoded = text.encode()
    given = lib.mtmd_input_text(encoded, len(encoded), True, True)
    chunks = lib.mtmd_input_chunks_init()
    try:
        assert lib.mtmd_tokenize(engine.vision._ctx, chunks, ctypes.byref(given), bitmaps, len(images)) == 0
        engine.context.forget(seq)
        n_past = ctypes.c_int32(0)
        rc = lib.mtmd_helper_eval_chunks(
            engine.vision._ctx,
            engine.context.ctx,
            chunks,
            0,
            seq,
            engine.context.n_batch,
            True,
            ctypes.byref(n_past),
        )
        assert rc == 0
        return n_past.value
    finally:
        lib.mtmd_input_chunks_free(chunks)
        for i in range(len(images)):
            lib.mtmd_bitmap_free(bitmaps[i])


def logits(engine: Engine) -> list[float]:
    row = llama().llama_get_logits_ith(engine.context.ctx, -1)
    return [row[i] for i in range(engine.model.n_vocab)]


def pos_max(engine: Engine, seq: int) -> int:
    return int(llama().llama_memory_seq_pos_max(engine.context.memory, seq))


def test_an_image_takes_its_positions_not_its_cells(engine: Engine, qwen: tuple[Path, Path]) -> None:
    _, model = qwen
    assert engine.vision.mrope
    image = png(1, SQUARE)
    prompt, text = prompt_for(engine, model, conversation(1), [image])
    (span,) = prompt.media.spans
    assert (span.n_tokens, span.n_pos) == (16, 4)
    engine.context.forget(0)
    engine.context.prefill(prompt.tokens, 0, media=prompt.media)
    ours = logits(engine)
    n_past = libmtmd_eval(engine, text, [load_image(image, name="t")], 1)
    theirs = logits(engine)
    assert engine.context.position(0) == n_past == len(prompt.tokens) - 12  # 16 cells, 4 positions
    assert pos_max(engine, 0) == pos_max(engine, 1) == n_past - 1
    assert ours == theirs  # the same positions, the same batches: the same floats


def test_a_conversation_re_sending_its_image_evaluates_only_new_text(
    engine: Engine, qwen: tuple[Path, Path]
) -> None:
    """Five turns, each re-sending the history with the image (a wide one: 8 x 4 tokens, 8 positions):
    each turn evaluates its new text only. The reference: libmtmd evaluates turn 1, then each turn's
    new text is decoded at the positions libmtmd's n_past gives (the same batches, so the same floats;
    a prompt evaluated whole sums in another order, by up to 1.0 in a logit on this model)."""
    _, model = qwen
    image = png(2, WIDE)
    turns = [prompt_for(engine, model, conversation(n), [image]) for n in range(1, 6)]
    engine.context.forget(0)
    before: list[int] = []
    for prompt, _ in turns:
        evaluated = engine.context.prefill(prompt.tokens, 0, media=prompt.media)
        shared = min(common_prefix(before, prompt.tokens), len(prompt.tokens) - 1)
        if before:
            assert shared > prompt.media.spans[0].start + 32  # the image is in the kept head
            assert evaluated == len(prompt.tokens) - shared
        before = list(prompt.tokens)
    ours = logits(engine)

    first, text = turns[0]
    fewer = len(first.tokens) - libmtmd_eval(engine, text, [load_image(image, name="t")], 1)
    assert fewer == 24  # 32 cells, 8 positions
    held = first.tokens
    for prompt, _ in turns[1:]:
        shared = min(common_prefix(held, prompt.tokens), len(prompt.tokens) - 1)
        llama().llama_memory_seq_rm(engine.context.memory, 1, shared - fewer, -1)
        batch = engine.context.batch_for(len(prompt.tokens) - shared)
        add_tokens(batch, 1, prompt.tokens[shared:], shared - fewer, logits=True)
        engine.context.evaluate(batch)
        held = prompt.tokens
    assert engine.context.position(0) == len(held) - fewer and pos_max(engine, 0) == pos_max(engine, 1)
    assert ours == logits(engine)


def test_a_kept_state_holding_an_image_is_restored(engine: Engine, qwen: tuple[Path, Path]) -> None:
    """A sequence's state with an M-RoPE image in it saved and loaded again (the prefix store's RAM
    tier, a growing context): the last position it ends on is the one the cells say."""
    _, model = qwen
    prompt, _ = prompt_for(engine, model, conversation(2), [png(3, SQUARE)])
    engine.context.forget(0)
    engine.context.prefill(prompt.tokens, 0, media=prompt.media)
    state = engine.context.state_bytes(0)
    assert engine.context.load_state(state, prompt.tokens, 2)
    assert engine.context.position(2) == engine.context.position(0) and pos_max(engine, 2) == pos_max(
        engine, 0
    )
    assert not engine.context.load_state(state, prompt.tokens[:-1], 3)  # not the cells it claims: refused


def test_a_batch_of_sequences_each_with_its_own_image(engine: Engine, qwen: tuple[Path, Path]) -> None:
    _, model = qwen
    sizes = [SQUARE, WIDE, (112, 224), (168, 112)]
    prompts = [
        prompt_for(engine, model, conversation(1), [png(10 + i, size)])[0] for i, size in enumerate(sizes)
    ]
    alone = []
    for p in prompts:
        engine.context.reset()
        alone.append(engine.generate(p.tokens, GREEDY, max_tokens=12, media=p.media).text)
    engine.context.reset()
    prompts = [
        prompt_for(engine, model, conversation(1), [png(10 + i, size)])[0] for i, size in enumerate(sizes)
    ]
    done: dict[int, str] = {}
    run_batch(
        engine,
        [Request(p, GREEDY, max_tokens=12) for p in prompts],
        lambda r: done.__setitem__(r.index, r.text),
    )
    assert [done[i] for i in range(4)] == alone


def test_run_image_on_an_m_rope_model(qwen: tuple[Path, Path], tmp_path: Path) -> None:
    projector, model = qwen
    usage = {}
    for name, size in (("square", SQUARE), ("wide", WIDE)):
        image = tmp_path / f"{name}.png"
        image.write_bytes(png(4, size))
        done = run_cli(
            "run", str(model), "What is this?", "--temperature", "0", "--max-tokens", "8", "--json",
            "--image", str(image), "--mmproj", str(projector),
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        usage[name] = json.loads(done.stdout)["usage"]["prompt_tokens"]
    # the prompt counts the image's cells (16 and 32), as the context holds them, not its positions
    assert usage["wide"] - usage["square"] == 16


def test_serve_keeps_an_m_rope_image_over_five_turns(qwen: tuple[Path, Path], tmp_path: Path) -> None:
    """`runner serve` with the openai client: a 5-turn chat re-sending its image (8 x 4 tokens over
    8 positions) each turn reuses the whole turn before it, the image in it, and evaluates only what
    is new; turn 1 answers as `runner run --image` does."""
    projector, model = qwen
    image = tmp_path / "wide.png"
    image.write_bytes(png(5, WIDE))
    url = "data:image/png;base64," + base64.b64encode(image.read_bytes()).decode()
    alone = run_cli(
        "run", str(model), "What is this?", "--image", str(image), "--mmproj", str(projector),
        "--temperature", "0", "--max-tokens", "8", "--json", "--threads", "1",
    )  # fmt: skip
    assert alone.returncode == 0, alone.stderr
    with model_server(tmp_path, "--mmproj", str(projector), model=str(model)) as server:
        client = openai_client(server)
        name = client.models.list().data[0].id
        content = [
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": "What is this?"},
        ]
        messages: list[Any] = [{"role": "user", "content": content}]
        usages = []
        for turn in range(5):
            reply = client.chat.completions.create(model=name, messages=messages, max_tokens=8, temperature=0)
            assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
            if turn == 0:
                assert reply.choices[0].message.content == json.loads(alone.stdout)["text"]
            usages.append(reply.usage)
            messages += [{"role": "assistant", "content": reply.choices[0].message.content}]
            messages += [{"role": "user", "content": f"And corner {turn}?"}]
    for before, after in zip(usages, usages[1:], strict=False):
        cached = after.prompt_tokens_details.cached_tokens  # type: ignore[union-attr]
        assert cached >= before.prompt_tokens, (before, after)  # the turn before, its image in it
        assert after.prompt_tokens - cached < 30  # only the answer and the new question evaluated
