"""Images through the one loop, with the test projectors (scripts/make_test_projector.py: random weights,
so answers mean nothing, but the same input gives the same tokens) on SmolLM2: `runner run --image`
from a file and from stdin, the images reaching the model, a kept prefix that holds an image (and
never ends inside one), a batch of sequences each with its own image against each one alone, and
every bad input refused in one line. The same answers from llama-server --mmproj:
scripts/bench_vision.py (docs/vision.md)."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
from pathlib import Path

import pytest

from runner.engine.batch import run_batch
from runner.engine.cells import common_prefix
from runner.engine.engine import Engine
from runner.engine.llamacpp import llama
from runner.engine.prompt import Prompt, render_prompt
from runner.engine.request import Request
from runner.engine.text.sampling import SamplingConfig
from runner.engine.text.template import Message
from runner.gguf import read_header
from runner.images import MAX_IMAGES, load_image
from tests.conftest import run_cli
from tests.helpers import load_script, wav
from tests.helpers import random_png as png

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "make_test_projector.py"
GREEDY = SamplingConfig(temperature=0)
IMAGE_TOKENS = 4  # both test projectors: 28/14 = 2x2 patches (mlp), 32/8 = 4x4 pooled by 2 (gemma3)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("vision")
    made = {}
    for kind in ("mlp", "gemma3"):
        made[kind] = folder / f"{kind}.gguf"
        subprocess.run(
            [sys.executable, str(SCRIPT), str(made[kind]), "--for", str(smollm2_path), "--type", kind],
            check=True,
            capture_output=True,
        )
    for seed, name in ((1, "a.png"), (2, "b.png")):
        made[name] = folder / name
        made[name].write_bytes(png(seed))
    return made


def run(*args: str, input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return run_cli("run", "smollm2", *args, "--temperature", "0", "--max-tokens", "12", input=input)


def answer(done: subprocess.CompletedProcess[bytes]) -> dict:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_run_with_an_image_from_a_file_or_stdin(files: dict[str, Path]) -> None:
    mlp = str(files["mlp"])
    plain = answer(run("What is this?", "--json"))
    first = answer(run("What is this?", "--image", str(files["a.png"]), "--mmproj", mlp, "--json"))
    again = answer(run("What is this?", "--image", str(files["a.png"]), "--mmproj", mlp, "--json"))
    piped = answer(
        run("What is this?", "--image", "-", "--mmproj", mlp, "--json", input=files["a.png"].read_bytes())
    )
    assert first["text"] and first["text"] == again["text"] == piped["text"]
    # the image's positions are in the prompt: its 4 tokens (an mlp projector adds no text around it)
    assert first["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"] + IMAGE_TOKENS
    two = answer(
        run(
            "Compare.",
            "--image",
            str(files["a.png"]),
            "--image",
            str(files["b.png"]),
            "--mmproj",
            str(files["gemma3"]),
            "--json",
        )
    )
    assert two["text"] and two["usage"]["prompt_tokens"] > plain["usage"]["prompt_tokens"] + 2 * IMAGE_TOKENS


@pytest.fixture(scope="module")
def vision_engine(files: dict[str, Path], smollm2_path: Path):
    with Engine(smollm2_path, n_ctx=2048, n_threads=2, n_seq=4) as engine:
        engine.attach_projector(files["mlp"])
        yield engine


def prompt_with(engine: Engine, path: Path, text: str, images: list[bytes]) -> Prompt:
    pixels = [load_image(b, name="t") for b in images]
    content = engine.vision.marker * len(images) + text
    return render_prompt(engine, read_header(path), [Message("user", content)], images=pixels)


def last_logits(engine: Engine) -> list[float]:
    row = llama().llama_get_logits_ith(engine.context.ctx, -1)
    return [row[i] for i in range(0, engine.model.n_vocab, 97)]


def test_the_image_reaches_the_model_and_a_kept_prefix_holds_it(
    vision_engine: Engine, smollm2_path: Path
) -> None:
    engine = vision_engine
    a, b = png(1), png(2)
    first = prompt_with(engine, smollm2_path, "Describe it.", [a])
    image_at = next(i for i, t in enumerate(first.tokens) if t < 0)
    assert sum(t < 0 for t in first.tokens) == IMAGE_TOKENS
    engine.context.reset()
    engine.context.prefill(first.tokens, 0, media=first.media)
    seen_a = last_logits(engine)
    # a longer question after the same image: only the new text is evaluated, the image kept
    longer = prompt_with(engine, smollm2_path, "Describe it in one word, please.", [a])
    assert longer.tokens[: image_at + IMAGE_TOKENS] == first.tokens[: image_at + IMAGE_TOKENS]
    shared = common_prefix(first.tokens, longer.tokens)
    assert shared >= image_at + IMAGE_TOKENS
    assert engine.context.prefill(longer.tokens, 0, media=longer.media) == len(longer.tokens) - shared
    # another image at the same place: evaluated again from the image's first position, never inside it
    other = prompt_with(engine, smollm2_path, "Describe it.", [b])
    assert engine.context.prefill(other.tokens, 0, media=other.media) == len(other.tokens) - image_at
    assert last_logits(engine) != seen_a  # the pixels changed what the model sees
    engine.context.prefill(
        first.tokens, 0, media=prompt_with(engine, smollm2_path, "Describe it.", [a]).media
    )
    assert last_logits(engine) == seen_a  # and the same pixels give the same


def test_a_batch_of_sequences_each_with_its_own_image_gives_each_ones_answer(
    vision_engine: Engine, smollm2_path: Path
) -> None:
    engine = vision_engine
    prompts = [prompt_with(engine, smollm2_path, "What is in the picture?", [png(seed)]) for seed in range(4)]
    alone = []
    for p in prompts:
        engine.context.reset()
        alone.append(engine.generate(p.tokens, GREEDY, max_tokens=16, media=p.media).text)
    engine.context.reset()
    prompts = [prompt_with(engine, smollm2_path, "What is in the picture?", [png(seed)]) for seed in range(4)]
    done: dict[int, str] = {}
    run_batch(
        engine,
        [Request(p, GREEDY, max_tokens=16) for p in prompts],
        lambda r: done.__setitem__(r.index, r.text),
    )
    assert [done[i] for i in range(4)] == alone


def test_bad_input_is_one_line_and_exit_2(files: dict[str, Path], tmp_path: Path) -> None:
    mlp, a = str(files["mlp"]), str(files["a.png"])
    (tmp_path / "sound.wav").write_bytes(wav())
    (tmp_path / "cut.png").write_bytes(files["a.png"].read_bytes()[:60])
    cases = {
        "--image needs the model's vision projector; none was pulled with smollm2": ("Hi", "--image", a),
        "--mmproj goes with --image": ("Hi", "--mmproj", mlp),
        "looks like text": ("Hi", "--image", str(SCRIPT), "--mmproj", mlp),
        "audio": ("Hi", "--image", str(tmp_path / "sound.wav"), "--mmproj", mlp),
        "truncated or corrupt": ("Hi", "--image", str(tmp_path / "cut.png"), "--mmproj", mlp),
        "no such file": ("Hi", "--image", str(tmp_path / "none.png"), "--mmproj", mlp),
        "--mmproj": ("Hi", "--image", a, "--mmproj", str(tmp_path / "none.gguf")),
        "at most": ("Hi", *[x for _ in range(MAX_IMAGES + 1) for x in ("--image", a)], "--mmproj", mlp),
        "goes with one prompt": ("Hi {}", "--each-line", "--image", a, "--mmproj", mlp),
    }
    for expected, args in cases.items():
        done = run(*args, input=b"x\n" if "--each-line" in args else None)
        lines = done.stderr.decode().strip().splitlines()
        assert done.returncode == 2 and done.stdout == b"", (expected, done.stderr)
        assert len(lines) == 1 and expected in lines[0], (expected, lines)


def test_a_malformed_projector_is_refused_before_libmtmd_opens_it(
    files: dict[str, Path], tmp_path: Path
) -> None:
    mtp = load_script("make_test_projector")
    kvs, tensors = mtp.projector_spec("mlp", 576, 0)
    tensors = {name: t for name, t in tensors.items() if not name.startswith("mm.2")}  # libmtmd: SIGSEGV
    mtp.write_projector(tmp_path / "bad.gguf", kvs, tensors)
    done = run("Hi", "--image", str(files["a.png"]), "--mmproj", str(tmp_path / "bad.gguf"))
    lines = done.stderr.decode().strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "mm.2" in lines[0], lines


def test_pixels_are_what_libmtmd_reads(files: dict[str, Path]) -> None:
    """The decoded rows go to libmtmd as they are: a bitmap's bytes read back equal Pillow's RGB."""
    from runner.engine.vision import mtmd

    image = load_image(files["a.png"].read_bytes(), name="a.png")
    lib = mtmd()
    data = (ctypes.c_uint8 * len(image.rgb)).from_buffer_copy(image.rgb)
    bitmap = lib.mtmd_bitmap_init(image.width, image.height, data)
    try:
        n = lib.mtmd_bitmap_get_n_bytes(bitmap)
        assert ctypes.string_at(lib.mtmd_bitmap_get_data(bitmap), n) == image.rgb
    finally:
        lib.mtmd_bitmap_free(bitmap)


def test_input_rows_name_their_images(files: dict[str, Path], tmp_path: Path) -> None:
    """--input's JSONL rows with "images" (files), in one batch: each the answer `run --image` gives."""
    rows = [
        {"prompt": "What is it?", "images": [str(files["a.png"])]},
        {"prompt": "And these?", "images": [str(files["b.png"]), str(files["a.png"])]},
        {"prompt": "No image here."},
        {"prompt": "Gone?", "images": [str(tmp_path / "gone.png")]},
    ]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    mlp = str(files["mlp"])
    done = run("--input", str(tmp_path / "rows.jsonl"), "--mmproj", mlp, "--jsonl")
    out = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert done.returncode == 2 and "gone.png: no such file" in out[3]["error"]
    for row, got in zip(rows[:3], out[:3], strict=True):
        images = [x for path in row.get("images", []) for x in ("--image", path)]
        alone = answer(run(row["prompt"], *images, *(("--mmproj", mlp) if images else ()), "--json"))
        assert got["text"] == alone["text"], row


@pytest.fixture(scope="module")
def idefics3(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> tuple[Path, Path]:
    """The idefics3 test projector and SmolLM2 with SmolVLM's image tokens (--vocab-out)."""
    folder = tmp_path_factory.mktemp("idefics3")
    projector, model = folder / "idefics3.gguf", folder / "model.gguf"
    subprocess.run(
        [sys.executable, str(SCRIPT), str(projector), "--for", str(smollm2_path), "--type", "idefics3",
         "--vocab-out", str(model)],
        check=True, capture_output=True,
    )  # fmt: skip
    return projector, model


def test_an_idefics3_image_is_its_tiles_and_the_whole_image(idefics3: tuple[Path, Path]) -> None:
    """A 64 x 48 image is 2 x 2 tiles and the whole image: 5 spans of 4 positions, text between them,
    each evaluated in its place; the same image gives the same logits again."""
    projector, model = idefics3
    with Engine(model, n_ctx=2048, n_threads=2) as engine:
        engine.attach_projector(projector)
        prompt = prompt_with(engine, model, "Describe it.", [png(1)])
        spans = prompt.media.spans
        assert [s.n_tokens for s in spans] == [IMAGE_TOKENS] * 5
        assert all(b.start > a.start + a.n_tokens for a, b in zip(spans, spans[1:], strict=False))
        engine.context.prefill(prompt.tokens, 0, media=prompt.media)
        seen = last_logits(engine)
        engine.context.reset()
        again = prompt_with(engine, model, "Describe it.", [png(1)])
        engine.context.prefill(again.tokens, 0, media=again.media)
        assert last_logits(engine) == seen


def test_an_idefics3_projector_on_a_model_without_its_tokens_is_one_line(
    idefics3: tuple[Path, Path], files: dict[str, Path]
) -> None:
    done = run("Hi", "--image", str(files["a.png"]), "--mmproj", str(idefics3[0]))
    lines = done.stderr.decode().strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "vocabulary lacks" in lines[0], lines
