"""runner serve without MODELS: every cached model and each .gguf of --models DIR, loaded on its first
request within the memory budget, unloaded when idle past its keep-alive, to make room, or when Ollama's
unload asks (the `ollama` client's load and unload requests)."""

from __future__ import annotations

import concurrent.futures
import subprocess
import sys
import time
from pathlib import Path

import httpx
import ollama
import pytest

from tests.serving import COUNTING, free_port, serving

ARGS = ["--parallel", "1", "--ctx", "512", "--threads", "2"]


@pytest.fixture
def models_dir(smollm2_path: Path, tmp_path: Path) -> Path:
    """A folder with a second model: SmolLM2's file under another name (a link, no copy)."""
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "other.gguf").symlink_to(smollm2_path)
    return folder


def ask(url: str, model: str, **extra: object) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "stream": False}
    return httpx.post(f"{url}/api/chat", json={**body, "options": {"num_predict": 4}, **extra}, timeout=120)


def loaded(url: str) -> list[str]:
    return [m["name"] for m in httpx.get(f"{url}/api/ps").json()["models"]]


def wait_unloaded(url: str, within_s: float = 15) -> None:
    """Until /api/ps is empty (the reaper looks every 0.25 s once a model is idle)."""
    deadline = time.monotonic() + within_s
    while loaded(url) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert loaded(url) == []


def planned(url: str, model: str) -> int:
    found = httpx.get(f"{url}/v1/models/{model}").json()["meta"]
    assert found["loaded"]
    return int(found["memory"])


def test_two_models_on_demand_and_keep_alive_zero(models_dir: Path, tmp_path: Path) -> None:
    with serving(["--models", str(models_dir), *ARGS], tmp_path / "stderr") as server:
        names = [m["id"] for m in httpx.get(f"{server.url}/v1/models").json()["data"]]
        assert {"smollm2", "other"} <= set(names) and loaded(server.url) == []  # nothing loaded ahead
        assert ask(server.url, "smollm2").json()["done"] and loaded(server.url) == ["smollm2"]
        assert ask(server.url, "other").json()["done"] and sorted(loaded(server.url)) == ["other", "smollm2"]
        assert planned(server.url, "other") > 0
        assert ask(server.url, "other", keep_alive=0).status_code == 200
        for _ in range(40):  # the reaper looks every 0.25 s
            if loaded(server.url) == ["smollm2"]:
                break
            httpx.get(f"{server.url}/health")
        assert loaded(server.url) == ["smollm2"]
        assert "unloading other (idle 0 s)" in server.stderr()


def test_a_budget_for_one_model_unloads_the_other_and_refuses_what_fits_nowhere(
    models_dir: Path, tmp_path: Path
) -> None:
    with serving(["--models", str(models_dir), *ARGS], tmp_path / "probe") as server:
        ask(server.url, "smollm2")
        one = planned(server.url, "smollm2")
    budget = int(one * 1.5)  # one model, not two
    with serving(["--models", str(models_dir), *ARGS, "--memory", str(budget)], tmp_path / "one") as server:
        assert ask(server.url, "smollm2").status_code == 200
        assert ask(server.url, "other").status_code == 200
        assert loaded(server.url) == ["other"]
        assert "unloading smollm2 (to make room for other)" in server.stderr()
    small = one // 2
    with serving(["--models", str(models_dir), *ARGS, "--memory", str(small)], tmp_path / "none") as server:
        refused = ask(server.url, "smollm2")
        assert refused.status_code == 400, refused.text
        message = refused.json()["error"]
        assert f"{one / 1e6:,.0f} MB" in message and f"{small / 1e6:,.0f} MB" in message
        assert loaded(server.url) == [] and httpx.get(f"{server.url}/health").status_code == 200


def test_eight_first_requests_load_the_model_once(models_dir: Path, tmp_path: Path) -> None:
    with serving(["--models", str(models_dir), *ARGS], tmp_path / "stderr") as server:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _: ask(server.url, "other"), range(8)))
        assert [a.status_code for a in answers] == [200] * 8
        assert server.stderr().count("runner: loading other") == 1


def test_ollamas_load_and_unload_requests_load_and_unload(models_dir: Path, tmp_path: Path) -> None:
    """Ollama's load (generate or chat with nothing to answer) loads the model and says how long that
    took; its unload (the same with keep_alive 0, what `ollama stop` sends) unloads it, at once when it
    is idle, else once its answer ends. They did nothing: "load" answered and /api/ps stayed empty."""
    with serving(["--models", str(models_dir), *ARGS], tmp_path / "stderr") as server:
        client = ollama.Client(host=server.url, timeout=120)
        load = client.generate(model="other")
        assert load.done_reason == "load" and loaded(server.url) == ["other"]
        assert load.load_duration and load.load_duration > 0
        assert client.generate(model="other").load_duration == 0  # loaded already
        unload = client.generate(model="other", keep_alive=0)
        assert unload.done and unload.done_reason == "unload" and unload.response == ""
        assert loaded(server.url) == []
        assert "runner: unloading other (asked to by a request)" in server.stderr()
        assert client.generate(model="other", keep_alive=0).done_reason == "unload"  # not loaded: no-op

        assert client.chat(model="smollm2", messages=[]).done_reason == "load"
        assert loaded(server.url) == ["smollm2"]
        unload_chat = client.chat(model="smollm2", messages=[], keep_alive="0s")
        assert unload_chat.done_reason == "unload" and unload_chat.message.role == "assistant"
        assert loaded(server.url) == []

        # answering, it stays until its answer ends, which the unload does not cut short
        options = {"num_predict": 400, "temperature": 0}
        stream = client.generate(model="other", prompt=COUNTING, raw=True, stream=True, options=options)
        first = next(stream)
        assert client.generate(model="other", keep_alive=0).done_reason == "unload"
        assert loaded(server.url) == ["other"]
        last = list(stream)[-1]
        assert last.done and last.done_reason == "length" and last.eval_count == 400
        assert first.load_duration is None and last.load_duration and last.load_duration > 0
        wait_unloaded(server.url)


def test_an_answer_that_waited_for_a_load_says_how_long(models_dir: Path, tmp_path: Path) -> None:
    """load_duration (nanoseconds, within total_duration): the wait for the model's load, whole,
    streamed and for embeddings; 0 once it is loaded. It was always 0."""
    with serving(["--models", str(models_dir), *ARGS, "--keep-alive", "-1"], tmp_path / "stderr") as server:
        client = ollama.Client(host=server.url, timeout=120)
        hi = [{"role": "user", "content": "Hi"}]
        options = {"num_predict": 2}
        cold = client.chat(model="other", messages=hi, options=options)
        warm = client.chat(model="other", messages=hi, options=options)
        assert cold.load_duration and cold.total_duration and cold.total_duration > cold.load_duration > 0
        assert warm.load_duration == 0
        last = list(client.chat(model="smollm2", messages=hi, options=options, stream=True))[-1]
        assert last.done and last.load_duration and last.load_duration > 0
        assert client.generate(model="smollm2", keep_alive=0).done_reason == "unload"
        embedded = client.embed(model="smollm2", input="Hi")
        assert embedded.load_duration and embedded.load_duration > 0
        assert client.embed(model="smollm2", input="Hi").load_duration == 0


def listed(url: str) -> tuple[list[str], list[str]]:
    """The names the openai and ollama clients list (each raises if the listing fails)."""
    import ollama
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    names = [m.id for m in client.models.list()]
    tags = [m.model or "" for m in ollama.Client(host=url).list().models]
    return sorted(names), sorted(tags)


def test_a_bad_file_is_skipped_and_the_folder_is_looked_at_again(
    smollm2_path: Path, models_dir: Path, tmp_path: Path
) -> None:
    """A file that is no model is said once at the start and left out: the listing answers 200 to
    the openai and ollama clients. A file added later is served, a removed one no longer is."""
    (models_dir / "bogus.gguf").write_text("not a model\n")
    with serving(["--models", str(models_dir), *ARGS], tmp_path / "stderr") as server:
        start = server.stderr()
        assert start.count("not serving bogus") == 1 and "not a GGUF file" in start, start
        names, tags = listed(server.url)
        assert "other" in names and "bogus" not in names, names
        assert "other" in tags and not any(t.startswith("bogus") for t in tags), tags
        assert ask(server.url, "bogus").status_code == 404
        (models_dir / "third.gguf").symlink_to(smollm2_path)
        (models_dir / "other.gguf").unlink()
        time.sleep(1.1)  # the folder is looked at again at most once a second
        names, tags = listed(server.url)
        assert "third" in names and "other" not in names, names
        assert ask(server.url, "third").status_code == 200
        assert ask(server.url, "other").status_code == 404
        (models_dir / "bogus.gguf").unlink()
        (models_dir / "later.gguf").write_bytes(b"GGUF\x03\x00")  # added later, no model either
        time.sleep(1.1)
        assert "later" not in listed(server.url)[0]
        listed(server.url)
        assert server.stderr().count("not serving later") == 1, server.stderr()


def test_named_models_with_a_folder_and_a_memory_limit(models_dir: Path, tmp_path: Path) -> None:
    """MODEL --models DIR: MODEL loaded now, the folder's files on demand beside it. MODEL whose plan
    is more than --memory: refused in one line (exit 2), not loaded past the limit."""
    with serving(["smollm2", "--models", str(models_dir), *ARGS], tmp_path / "both") as server:
        assert loaded(server.url) == ["smollm2"]
        assert {"smollm2", "other"} <= set(listed(server.url)[0])
        assert ask(server.url, "other").status_code == 200
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "runner",
            "serve",
            "smollm2",
            *ARGS,
            "--memory",
            "10M",
            "--port",
            str(free_port()),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "--memory 10M allows 10 MB" in last and "Traceback" not in done.stderr, done.stderr


def test_a_model_without_a_chat_template_is_served_with_a_warning(smollm2_path: Path, tmp_path: Path) -> None:
    """As `runner run` warns: at the start for a model loaded then, at its load for one on demand."""
    from tests.synth import write_scripted

    folder = tmp_path / "plain"
    folder.mkdir()
    plain = write_scripted(folder / "plain.gguf", smollm2_path, [28, 29, 2], template="")
    with serving([str(plain), *ARGS], tmp_path / "named") as server:
        assert server.stderr().count("plain has no chat template") == 1, server.stderr()
        assert ask(server.url, "plain").status_code == 200
        assert ollama.Client(host=server.url).show("plain").template == ""  # read as Ollama's
        shown = httpx.post(f"{server.url}/api/show", json={"model": "plain"}).json()
        assert "no chat template" in shown["warnings"][0]
    with serving(["--models", str(folder), *ARGS], tmp_path / "on-demand") as server:
        assert "no chat template" not in server.stderr()
        assert ask(server.url, "plain").status_code == 200
        assert server.stderr().count("plain has no chat template") == 1, server.stderr()
        assert "warnings" not in httpx.post(f"{server.url}/api/show", json={"model": "smollm2"}).json()


def test_the_projector_hint_names_the_model_as_runner_serve_was_given_it(
    smollm2_path: Path, models_dir: Path, tmp_path: Path
) -> None:
    """An image to a model served without a projector: the 400's hint is a command that works as
    written. A file named on the command line is served under its stem, which names no file: the hint
    names the path given; a file of --models DIR, its path there."""
    import base64

    from runner.hub.catalog import load_catalog
    from runner.hub.refs import LocalRef, resolve
    from tests.helpers import random_png

    image = base64.b64encode(random_png(1)).decode()
    with serving([str(smollm2_path), "--models", str(models_dir), *ARGS], tmp_path / "stderr") as server:
        client = ollama.Client(host=server.url)
        for name, path in ((smollm2_path.stem, smollm2_path), ("other", models_dir / "other.gguf")):
            with pytest.raises(ollama.ResponseError) as refused:
                client.chat(model=name, messages=[{"role": "user", "content": "Hi", "images": [image]}])
            said = refused.value.error
            assert refused.value.status_code == 400 and f"(runner serve {path} --mmproj FILE)" in said, said
            given = resolve(str(path), load_catalog())  # what the hint's command resolves the model to
            assert isinstance(given, LocalRef) and given.path.stem == name
