"""The chat page in a real browser: headless Chromium (Debian's `chromium`) driven by Playwright for
Python through `executable_path` (Playwright's own browser download is not needed). With SmolLM2 on a
real `runner serve`: a chat sent in the page, streamed, kept where `runner history` and `runner run -c`
find it, and the other way round; the stop button; delete asks first. Over the real app with a
stand-in backend (no model): the key prompt, and answers made of XSS strings rendered inert.

Without Chromium or Playwright the module is skipped with one reason saying how to get them."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import random_png
from serving import StandIn, outcome_of, serving

CHROMIUM = os.environ.get("RUNNER_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
HOW = "apt-get install chromium (Debian) and pip install playwright, or RUNNER_CHROMIUM=/path/to/chrome"
if CHROMIUM is None:
    pytest.skip(f"no Chromium for the browser tests: {HOW}", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason=f"no Playwright for the browser tests: {HOW}")

GREEDY = ("--temperature", "0", "--threads", "1")
WAIT_MS = 60_000


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def served(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    """`runner serve SmolLM2` with a data folder of its own (its conversation store)."""
    folder = tmp_path_factory.mktemp("webui")
    data = folder / "data"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RUNNER_DATA_DIR", str(data))
        with serving([str(smollm2_path), *GREEDY], folder / "stderr") as server:
            yield server, data


@pytest.fixture
def page(browser: Any, tmp_path: Path) -> Iterator[Any]:
    context = browser.new_context()
    tab = context.new_page()
    problems: list[str] = []
    tab.on("pageerror", lambda exc: problems.append(str(exc)))
    yield tab
    context.close()
    assert not problems, problems  # no script error on the page


def runner(data: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RUNNER_DATA_DIR": str(data)}
    return subprocess.run(
        [sys.executable, "-m", "runner", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def ready(tab: Any, url: str) -> None:
    tab.goto(url)
    tab.wait_for_selector("body[data-ready=true]")


def settings(tab: Any, **values: str) -> None:
    tab.click("#settings-btn")
    for name, value in values.items():
        tab.fill(f"#settings-form [name={name}]", value)
    tab.click("#settings-save")


def send(tab: Any, text: str) -> None:
    tab.fill("#input", text)
    tab.keyboard.press("Enter")


def answering(tab: Any) -> None:
    """Until the answer has begun to stream in, the stop button still showing."""
    tab.wait_for_function(
        "() => { const b = document.querySelector('#log article.assistant:last-child > .body');"
        " return b && b.textContent.length > 0 && !document.getElementById('stop').hidden; }",
        timeout=WAIT_MS,
    )


def watch(tab: Any) -> None:
    """window.seen: the length of the answer coming, each time the page changes while Stop shows."""
    tab.evaluate(
        "() => { window.seen = []; new MutationObserver(() => {"
        " const b = document.querySelector('#log article.assistant:last-child > .body');"
        " if (b && !document.getElementById('stop').hidden) window.seen.push(b.textContent.length);"
        " }).observe(document.getElementById('log'), {childList: true, subtree: true}); }"
    )


def answered(tab: Any) -> None:
    tab.wait_for_selector("#send:not([hidden])", timeout=WAIT_MS)


def test_a_chat_in_the_page_is_the_terminals(
    served: tuple[Any, Path], page: Any, tmp_path: Path, smollm2_path: Path
) -> None:
    server, data = served
    ready(page, server.url)
    settings(page, max_tokens="48", system="Answer briefly.")
    watch(page)
    send(page, "Write a long poem about the sea.")
    answered(page)
    seen = page.evaluate("window.seen")
    assert len(set(seen)) >= 2, seen  # streamed: the answer grew on the page while it still came
    number = int(page.evaluate("location.hash.slice(1)"))
    listed = json.loads(runner(data, "history", "--json").stdout)
    mine = next(c for c in listed if c["id"] == number)
    assert mine["turns"] == 1 and mine["first_words"] == "Write a long poem about the sea."
    shown = page.locator("#log article.assistant > .body").first.inner_text()
    kept = json.loads(runner(data, "history", "show", str(number), "--json").stdout)
    assert kept["system"] == "Answer briefly." and kept["settings"] == {"max_tokens": 48}
    assert kept["messages"][1]["content"].strip() and kept["messages"][1]["content"].split()[0] in shown

    more = runner(data, "run", "-c", "And of Spain?", "--max-tokens", "8", *GREEDY)
    assert more.returncode == 0, more.stderr
    resumed = runner(
        data, "chat", "--resume", str(number), "--max-tokens", "4", *GREEDY, stdin="And Italy?\n"
    )
    assert resumed.returncode == 0, resumed.stderr
    page.reload()
    page.wait_for_selector("body[data-ready=true]")
    users = page.locator("#log article.user").all_inner_texts()
    assert users[-2].endswith("And of Spain?") and users[-1].endswith("And Italy?")
    assert page.locator("#log article.assistant").count() == 3  # the terminal's turns, in the page

    chat = runner(
        data, "chat", str(smollm2_path), "--max-tokens", "4", *GREEDY, stdin="Hello from a terminal\n"
    )
    assert chat.returncode == 0, chat.stderr
    page.reload()
    page.wait_for_selector("body[data-ready=true]")
    assert "Hello from a terminal" in page.locator("#chats").inner_text()
    page.locator("#chats button", has_text="Hello from a terminal").click()
    # the conversation shown before stays in the log until the one clicked has loaded: wait for it
    page.wait_for_function(
        "() => { const a = document.querySelector('#log article.user');"
        " return a !== null && a.innerText.endsWith('Hello from a terminal'); }"
    )
    assert page.locator("#log article.user").count() == 1

    artifacts = Path(os.environ.get("RUNNER_TEST_ARTIFACTS", tmp_path))
    artifacts.mkdir(parents=True, exist_ok=True)
    page.set_viewport_size({"width": 390, "height": 780})  # a phone: the list folds away, the chat fits
    page.screenshot(path=str(artifacts / "webui-phone.png"))
    assert page.evaluate("document.documentElement.scrollWidth") <= 390


def test_stop_ends_the_answer_at_once_and_delete_asks_first(served: tuple[Any, Path], page: Any) -> None:
    server, data = served
    ready(page, server.url)
    settings(page, max_tokens="1500")
    send(page, "Write a very long story about a dragon and a knight, with many chapters.")
    answering(page)
    stopped = time.monotonic()
    page.click("#stop")
    answered(page)
    assert time.monotonic() - stopped < 5
    number = int(page.evaluate("location.hash.slice(1)"))
    kept = httpx.get(f"{server.url}/runner/v1/conversations/{number}").json()["messages"][-1]
    assert kept["interrupted"] and kept["stats"]["finish_reason"] == "interrupted"
    assert kept["stats"]["completion_tokens"] < 1500
    assert page.locator("#log article.interrupted").count() == 1

    asked: list[str] = []

    def no(dialog: Any) -> None:
        asked.append(dialog.message)
        dialog.dismiss()

    page.once("dialog", no)
    page.click("#delete")
    assert asked and str(number) in asked[0]
    assert httpx.get(f"{server.url}/runner/v1/conversations/{number}").status_code == 200  # kept
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#delete")
    page.wait_for_function(f"() => !document.querySelector('#chats [data-id=\"{number}\"]')")
    assert httpx.get(f"{server.url}/runner/v1/conversations/{number}").status_code == 404
    gone = runner(data, "history", "show", str(number))  # the store's own word, not a list's numbers
    assert gone.returncode == 2 and f"no conversation {number}" in gone.stderr, gone.stderr


@pytest.fixture(scope="module")
def seeing(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path, Path]]:
    """`runner serve SmolLM2 --mmproj` a test projector (random weights: the answers mean nothing, but
    the same prompt gives the same tokens), and an image."""
    folder = tmp_path_factory.mktemp("webui-vision")
    mlp, image = folder / "mlp.gguf", folder / "a.png"
    script = Path(__file__).resolve().parent.parent / "scripts" / "make_test_projector.py"
    made = [sys.executable, str(script), str(mlp), "--for", str(smollm2_path), "--type", "mlp"]
    subprocess.run(made, check=True, capture_output=True)
    image.write_bytes(random_png(1))
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RUNNER_DATA_DIR", str(folder / "data"))
        with serving([str(smollm2_path), "--mmproj", str(mlp), *GREEDY], folder / "stderr") as server:
            yield server, mlp, image


def test_an_image_is_answered_as_runner_run_answers_it(
    seeing: tuple[Any, Path, Path], page: Any, smollm2_path: Path
) -> None:
    server, mlp, image = seeing
    ready(page, server.url)
    settings(page, max_tokens="12")
    page.set_input_files("#file", str(image))  # the + button's file input (drag and paste fill the same list)
    page.wait_for_selector("#attached img")
    send(page, "What is this?")
    answered(page)
    page.wait_for_selector("#log article.user .thumbs img[src^='blob:']")  # shown again, from the server
    shown = page.locator("#log article.assistant > .body").last.inner_text()
    args = ["run", str(smollm2_path), "What is this?", "--image", str(image), "--mmproj", str(mlp)]
    alone = runner(Path(server.log).parent / "data", *args, "--max-tokens", "12", "--json", *GREEDY)
    assert alone.returncode == 0, alone.stderr
    expected = json.loads(alone.stdout)["text"]
    number = int(page.evaluate("location.hash.slice(1)"))
    kept = httpx.get(f"{server.url}/runner/v1/conversations/{number}").json()["messages"]
    assert kept[1]["content"] == expected and expected.split()[0] in shown
    assert kept[0]["images"][0]["size"] == image.stat().st_size


XSS = [
    "<script>alert('xss')</script>",
    '<img src=x onerror="alert(1)">',
    "[click me](javascript:alert(1))",
    '<svg onload="alert(1)"><script>alert(2)</script></svg>',
    "![x](http://evil.example/track.png)",
    "```html\n<script>fetch('http://evil.example/')</script>\n```",
]


@pytest.fixture
def stand_in(_own_data_dir: Path) -> Iterator[str]:
    """The real app over a stand-in backend whose every answer is the XSS strings, with a key, on a
    loopback port (uvicorn in a thread)."""
    import uvicorn

    from runner.serve.app import create_app
    from runner.serve.webui.conversations import Conversations

    text = "\n\n".join(XSS)
    backend = StandIn(
        parts=[("answer", x + "\n\n") for x in XSS], outcome=outcome_of(text, completion_tokens=9)
    )
    store = Conversations()
    app = create_app(backend, api_key="key-1", webui=store, log=lambda line: None)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)
    store.close()


def test_the_key_prompt_and_answers_rendered_inert(stand_in: str, page: Any) -> None:
    dialogs: list[str] = []
    elsewhere: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.on(
        "request",
        lambda r: None if r.url.startswith((stand_in, "data:", "blob:")) else elsewhere.append(r.url),
    )
    page.goto(stand_in)
    page.wait_for_selector("#keybox[open]")  # the key is asked for once
    page.fill("#key", "key-1")
    page.keyboard.press("Enter")
    page.wait_for_selector("body[data-ready=true]")
    assert page.evaluate("sessionStorage.getItem('runner-api-key')") == "key-1"
    send(page, "Hi")
    answered(page)
    page.wait_for_selector("#log article.assistant > .body")
    body = page.locator("#log article.assistant > .body").last
    shown = body.inner_text()
    assert "<script>alert('xss')</script>" in shown and 'onerror="alert(1)"' in shown
    assert body.locator("script, img, svg, iframe, a[href^='javascript']").count() == 0
    assert "click me" in shown  # the link's text, without the link
    page.reload()
    page.wait_for_selector("body[data-ready=true]")  # the key kept for the tab: not asked again
    assert page.locator("#keybox[open]").count() == 0
    assert page.locator("#log article.assistant > .body").last.inner_text() == shown  # stored, the same
    page.wait_for_timeout(300)
    assert dialogs == [] and elsewhere == []  # nothing ran, nothing was fetched from another origin
