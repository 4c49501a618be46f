"""Images in `runner chat`, with the mlp test projector on SmolLM2 (scripts/make_test_projector.py: random
weights, so answers mean nothing, but the same input gives the same tokens): /image and a pasted path
attach an image to the next message, which is answered as `runner run --image` answers it and is not
evaluated again on the next turn; the store keeps each image's sha256, size and path; --resume reads the
files again (or says they are gone or changed, and goes on without them); every bad image, and /image
without a projector, is one line and the chat goes on; a Ctrl-C during an image's encode is said at
once and ends the answer after it."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import sqlite3
import struct
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import pexpect
import pytest

from runner.images import ImageRef
from runner.store import Store
from tests.conftest import run_cli
from tests.helpers import GREEDY, conversations, ready, spawn
from tests.helpers import random_png as png

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "make_test_projector.py"
IMAGE_TOKENS = 4  # the mlp test projector: 28/14 = 2x2 patches
SAME = [*GREEDY, "--max-tokens", "12", "--flash-attn", "off"]  # run's and chat's loads alike


@pytest.fixture(scope="module")
def mlp(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> Path:
    out = tmp_path_factory.mktemp("projector") / "mlp.gguf"
    made = [sys.executable, str(SCRIPT), str(out), "--for", str(smollm2_path), "--type", "mlp"]
    subprocess.run(made, check=True, capture_output=True)
    return out


@pytest.fixture
def photo(tmp_path: Path) -> Path:
    path = tmp_path / "photo.png"
    path.write_bytes(png(1))
    return path


def chat(lines: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    return run_cli("chat", "smollm2", *SAME, *args, input=lines.encode())


def stats(stderr: bytes) -> tuple[int, int]:
    """The last /stats: the prompt's tokens, and how many of them were evaluated."""
    found = re.findall(rb"prompt (\d+) tokens(?:: (\d+) evaluated|, all evaluated)", stderr)
    assert found, stderr
    prompt, evaluated = found[-1]
    return int(prompt), int(evaluated or prompt)


def context_used(stderr: bytes) -> int:
    found = re.search(rb"context +([\d,]+) of", stderr)
    assert found, stderr
    return int(found[1].replace(b",", b""))


def test_an_attached_image_is_answered_as_run_answers_it_and_evaluated_once(mlp: Path, photo: Path) -> None:
    done = chat(f"/image {photo}\nWhat is this?\nAnd again?\n/stats\n", "--mmproj", str(mlp))
    assert done.returncode == 0, done.stderr
    assert f"attached photo.png (40x30, {photo.stat().st_size:,} bytes)".encode() in done.stderr
    alone = run_cli("run", "smollm2", "What is this?", "--image", str(photo), "--mmproj", str(mlp), *SAME)
    assert alone.returncode == 0, alone.stderr
    first_answer = done.stdout.decode().split("\n\n")[0]
    assert first_answer.strip() and first_answer.strip() == alone.stdout.decode().strip()
    # the second turn re-sends the image in the first one's place: kept in the KV cache, not evaluated
    prompt, evaluated = stats(done.stderr)
    assert evaluated <= 20 < prompt - evaluated, done.stderr
    [conversation] = conversations()
    ref = ImageRef(hashlib.sha256(photo.read_bytes()).hexdigest(), photo.stat().st_size, str(photo))
    assert [m.images for m in conversation.messages] == [(ref,), (), (), ()]
    shown = json.loads(run_cli("history", "show", str(conversation.id), "--json").stdout)
    assert shown["messages"][0]["images"] == [ref.to_json()] and "images" not in shown["messages"][2]
    # the image text-only: another answer (the pixels reached the model)
    plain = chat("What is this?\n")
    assert plain.returncode == 0 and plain.stdout.decode().strip() != first_answer.strip()


def test_resume_reads_the_images_again_or_says_why_not(mlp: Path, photo: Path) -> None:
    projector = ("--mmproj", str(mlp))
    assert chat(f"/image {photo}\nWhat is this?\n", *projector).returncode == 0
    resumed = run_cli("chat", "--resume", *projector, *SAME, input=b"/show\n")
    assert resumed.returncode == 0, resumed.stderr
    assert b"this conversation refers to 1 image: photo.png (read again)" in resumed.stderr
    with_image = context_used(resumed.stderr)

    photo.write_bytes(png(2))  # another image under the same name
    changed = run_cli("chat", "--resume", *projector, *SAME, input=b"/show\n")
    assert b"this conversation refers to 1 image: photo.png (not sent)" in changed.stderr
    assert f"{photo}: changed since it was attached (its sha256 differs)".encode() in changed.stderr
    assert context_used(changed.stderr) == with_image - IMAGE_TOKENS  # the text goes on without it

    photo.unlink()
    gone = run_cli("chat", "--resume", *projector, *SAME, input=b"/show\n")
    assert f"{photo}: no such file; the message that carried it goes on".encode() in gone.stderr
    assert context_used(gone.stderr) == with_image - IMAGE_TOKENS

    text_only = run_cli("chat", "--resume", *SAME, input=b"/show\n")
    assert b"refers to 1 image (photo.png); without a projector they are not sent" in text_only.stderr
    assert context_used(text_only.stderr) == with_image - IMAGE_TOKENS

    photo.write_bytes(png(1))  # back as it was: `run -c` sends it again, and answers
    more = run_cli("run", "-c", "And now?", *projector, *SAME)
    assert more.returncode == 0 and more.stdout.strip(), more.stderr
    assert b"photo.png (read again)" in more.stderr
    [conversation] = conversations()
    assert [len(m.images) for m in conversation.messages] == [1, 0, 0, 0]


def test_run_c_takes_images_as_one_more_turn(mlp: Path, photo: Path) -> None:
    # `run -c PROMPT --image FILE` is the turn a chat sends after /image FILE: kept by path and sha256
    projector = ("--mmproj", str(mlp))
    assert chat("Hi\n", *projector).returncode == 0
    more = run_cli("run", "-c", "What is this?", "--image", str(photo), *projector, *SAME)
    assert more.returncode == 0 and more.stdout.strip(), more.stderr
    [conversation] = conversations()
    ref = ImageRef(hashlib.sha256(photo.read_bytes()).hexdigest(), photo.stat().st_size, str(photo))
    assert [m.images for m in conversation.messages] == [(), (), (ref,), ()]
    assert conversation.messages[2].content == "What is this?"
    # the same turns through a chat with /image: the same answer (the pixels reached the model)
    same = chat(f"Hi\n/image {photo}\nWhat is this?\n", *projector)
    assert same.returncode == 0, same.stderr
    assert same.stdout.decode().split("\n\n")[1].strip() == more.stdout.decode().strip()
    # refused plainly, never ignored: no projector, an image from stdin (nothing to read again)
    bare = run_cli("run", "-c", "And this?", "--image", str(photo), *SAME)
    assert bare.returncode == 2 and bare.stdout == b"", bare.stderr
    assert (
        "runner: error: --image needs the model's vision projector: give --mmproj FILE"
        in bare.stderr.decode()
    )
    piped = run_cli("run", "-c", "And this?", "--image", "-", *projector, input=photo.read_bytes())
    assert piped.returncode == 2 and b"give a file" in piped.stderr, piped.stderr
    assert len(conversations()) == 2 and len(conversations()[1].messages) == 4  # neither turn was sent


def png_claiming(width: int, height: int) -> bytes:
    """A PNG whose header says width x height, and nothing else."""
    body = b"IHDR" + struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + body + struct.pack(">I", zlib.crc32(body))


def test_bad_images_and_no_projector_are_one_line_each_and_the_chat_goes_on(
    mlp: Path, photo: Path, tmp_path: Path
) -> None:
    (tmp_path / "notes.png").write_text("not a picture\n")
    (tmp_path / "huge.png").write_bytes(png_claiming(9000, 10))
    no_projector = chat(f"/image {photo}\nHi\n")
    assert no_projector.returncode == 2 and no_projector.stdout.strip()  # refused, then answered
    errors = [line for line in no_projector.stderr.decode().splitlines() if "error" in line]
    assert errors == [
        "runner: error: /image needs the model's vision projector: start the chat with --mmproj FILE",
        "runner: error: some lines were refused (said above); the others were answered",
    ]
    lines = (
        f"/image {tmp_path / 'notes.png'}\n/image {tmp_path / 'huge.png'}\n/image {tmp_path / 'none.png'}\n"
        f"/image {tmp_path}\n/image {photo}\n/image\n/image none\n/image\nHi\n"
    )
    done = chat(lines, "--mmproj", str(mlp))
    assert done.returncode == 2 and done.stdout.strip(), done.stderr
    said = done.stderr.decode().splitlines()
    assert [line for line in said if "error" in line] == [
        f"runner: error: {tmp_path / 'notes.png'}: looks like text, not an image runner reads "
        "(accepted: PNG, JPEG, WebP, GIF, BMP)",
        f"runner: error: {tmp_path / 'huge.png'}: 9000x10 pixels is over 8,192 a side "
        "(a decompression bomb?)",
        f"runner: error: {tmp_path / 'none.png'}: no such file",
        f"runner: error: {tmp_path}: is a directory, not an image file",
        "runner: error: some lines were refused (said above); the others were answered",
    ]
    assert "runner: the next message carries photo.png" in said
    assert "runner: dropped 1 image" in said
    assert "runner: no image attached; /image PATH attaches one to the next message" in said
    [without, with_bad] = conversations()
    assert all(not m.images for m in [*without.messages, *with_bad.messages])
    assert [m.content for m in with_bad.messages if m.role == "user"] == ["Hi"]


def test_on_a_terminal_a_pasted_path_is_offered_and_tab_completes_image_paths(mlp: Path, photo: Path) -> None:
    child = spawn("chat", "smollm2", "--mmproj", str(mlp), *SAME)
    child.expect_exact("/image PATH to attach an image")
    ready(child)
    child.sendline(f"'{photo}' ")  # as a terminal pastes a dragged file: quoted, a space after
    child.expect_exact("attach photo.png to your next message? [Y/n]")
    child.sendline("")
    child.expect_exact("attached photo.png")
    ready(child)
    child.sendline("What is this?")
    ready(child)
    child.sendline(str(photo))
    child.expect_exact("[Y/n]")
    child.sendline("n")  # no: the line is a message, as typed
    ready(child)
    child.sendline(str(photo))
    child.expect_exact("[Y/n]")
    child.sendcontrol("c")  # neither: the line is dropped
    ready(child)
    child.send("/ima\t")  # the command, then the path, by Tab
    child.send(str(photo.parent / "pho") + "\t")
    child.sendline("")
    child.expect_exact("attached photo.png")
    ready(child)
    child.sendline("/bye")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    [conversation] = conversations()
    users = [m for m in conversation.messages if m.role == "user"]
    assert [(m.content, len(m.images)) for m in users] == [("What is this?", 1), (str(photo), 0)]
    alone = run_cli("run", "smollm2", "What is this?", "--image", str(photo), "--mmproj", str(mlp), *SAME)
    assert conversation.messages[1].content == alone.stdout.decode().strip()


def test_ctrl_c_during_an_image_encode_is_said_at_once_and_ends_the_answer_after_it(
    mlp: Path, smollm2_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """libmtmd's encode cannot be stopped part-way: made slow here, with a Ctrl-C in the middle of it."""
    from runner import ui
    from runner.engine import vision
    from runner.engine.engine import Engine
    from runner.engine.prompt import render_prompt
    from runner.engine.request import Request
    from runner.engine.text.sampling import SamplingConfig
    from runner.engine.text.template import Message
    from runner.gguf import read_header
    from runner.images import load_image

    lib = vision.mtmd()
    real = lib.mtmd_helper_eval_chunk_single
    timeline: dict[str, float] = {}

    def slow_encode(*args: object) -> int:
        threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT)).start()
        time.sleep(0.8)
        timeline["encoded"] = time.monotonic()
        return int(real(*args))

    said = ui.info
    monkeypatch.setattr(lib, "mtmd_helper_eval_chunk_single", slow_encode)
    monkeypatch.setattr(ui, "info", lambda text: (timeline.setdefault("said", time.monotonic()), said(text)))
    with Engine(smollm2_path, n_ctx=512, n_threads=2) as engine:
        engine.attach_projector(mlp)
        image = load_image(png(1), name="photo.png")
        messages = [Message("user", engine.vision.marker + "What is this?")]
        prompt = render_prompt(engine, read_header(smollm2_path), messages, images=[image])
        greedy = SamplingConfig(temperature=0)
        last = list(engine.stream(Request(prompt, greedy, max_tokens=8)))
    result = last[-1].result
    assert result is not None and result.finish_reason == "interrupted" and result.text == ""
    assert timeline["said"] < timeline["encoded"] - 0.4  # said while the encode still ran
    assert vision.ENCODE_WAIT in capfd.readouterr().err


@pytest.mark.fast
def test_a_database_from_before_images_is_migrated_and_its_messages_read(tmp_path: Path) -> None:
    from runner.store import MIGRATIONS

    path = tmp_path / "old.db"
    db = sqlite3.connect(path, isolation_level=None)
    for step in MIGRATIONS[:4]:  # the schema as runner wrote it before images
        step(db)
    db.execute("PRAGMA user_version = 4")
    db.execute("INSERT INTO conversations (model, created, updated) VALUES ('smollm2', 1, 1)")
    db.execute("INSERT INTO messages (conversation_id, role, content, created) VALUES (1, 'user', 'Hi', 1)")
    db.close()
    store = Store.open(path)
    try:
        loaded = store.load(1)
        assert loaded is not None and [(m.content, m.images) for m in loaded.messages] == [("Hi", ())]
        assert int(sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0]) == len(MIGRATIONS)
    finally:
        store.close()


@pytest.mark.fast
def test_a_conversation_file_with_a_malformed_image_is_refused() -> None:
    from runner.errors import UsageError
    from runner.store.file import from_json

    good = {"sha256": "ab" * 32, "size": 10, "path": "/p.png"}
    data = {"messages": [{"role": "user", "content": "Hi", "images": [good]}]}
    assert from_json(data, "f").messages[0].images == (ImageRef("ab" * 32, 10, "/p.png"),)
    for bad in ([{**good, "sha256": "xyz"}], [{**good, "size": "10"}], "p.png", 3):
        data = {"messages": [{"role": "user", "content": "Hi", "images": bad}]}
        with pytest.raises(UsageError, match='"images" must be a list'):
            from_json(data, "f")


@pytest.mark.model
def test_the_disk_cache_passes_over_a_prompt_with_an_image(engine, tmp_path: Path) -> None:
    """A head stored on disk is found for a prompt only before its first image (an image's state
    depends on the projector, which the cache's identity does not name), and never crashes on one."""
    from runner.engine.positions import image_tokens
    from runner.engine.promptcache import MIN_HEAD, PromptCache

    cache = PromptCache(tmp_path, 1 << 30, lambda _warning: None)
    text = engine.model.tokenize("A long enough head of plain text, " * 12)
    assert len(text) > MIN_HEAD + 8
    engine.context.reset()
    engine.context.prefill(text, 0)
    assert cache.store(engine.context, text).stored_tokens == len(text)
    image = image_tokens("ab" * 32, IMAGE_TOKENS)
    assert cache.lengths(engine.context, [*text, *image, 1], 0) == [len(text)]  # the text before the image
    assert cache.lengths(engine.context, [*text[:MIN_HEAD], *image, *text[MIN_HEAD:], 1], 0) == []
    assert cache.store(engine.context, [*text[:MIN_HEAD], *image]).stored_tokens == 0
