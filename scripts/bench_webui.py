"""The chat page of `runner serve`: its first load, and an answer's time to first token in the page
against the same request made by the openai client.

    python scripts/bench_webui.py [--model smollm2] [--rounds 5] [--screenshots DIR]

One `runner serve MODEL --threads 1` on a free loopback port (its own data folder, thrown away), and
headless Chromium (Debian's `chromium`, through Playwright's executable_path):
  first load    a fresh browser context (empty cache) opens the page: the bytes transferred (every
                response's body as sent, gzipped, plus its headers: Playwright's request.sizes()),
                the number of requests, and the time from navigation to the page ready (its models
                and conversation list loaded, `body[data-ready]`), median of --rounds.
  TTFT          a one-message chat ("Name three colours.", max_tokens 8, temperature 0): in the page,
                from pressing Enter to the answer's first text on the page (a MutationObserver);
                with the openai client, from the call to the first content delta of a streamed
                /v1/chat/completions. Alternated, a warm-up of each first, median of --rounds; the
                ratio page / client (target <= 1.1).
With --screenshots DIR: the page at a desktop and a phone width, after one answer (docs/webui.md's).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import openai
from playwright.sync_api import sync_playwright

PROMPT = "Name three colours."
MAX_TOKENS = 8


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(model: str, data: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, "RUNNER_DATA_DIR": str(data)}
    data.mkdir(parents=True, exist_ok=True)
    log = (data.parent / "serve.log").open("wb")
    args = [sys.executable, "-m", "runner", "serve", model, "--threads", "1", "--temperature", "0"]
    proc = subprocess.Popen([*args, "--port", str(port)], stderr=log, stdout=subprocess.DEVNULL, env=env)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"the server did not start: {data.parent / 'serve.log'}")


def first_load(browser: object, url: str) -> tuple[int, int, float]:
    context = browser.new_context()  # type: ignore[attr-defined]
    page = context.new_page()
    responses = []
    page.on("requestfinished", lambda r: responses.append(r))
    began = time.perf_counter()
    page.goto(url)
    page.wait_for_selector("body[data-ready=true]")
    ready = time.perf_counter() - began
    sizes = [r.sizes() for r in responses]
    sent = sum(s["responseBodySize"] + s["responseHeadersSize"] for s in sizes)
    context.close()
    return sent, len(sizes), ready


def page_ttft(browser: object, url: str) -> float:
    context = browser.new_context()  # type: ignore[attr-defined]
    page = context.new_page()
    page.goto(url)
    page.wait_for_selector("body[data-ready=true]")
    page.click("#settings-btn")
    page.fill("#settings-form [name=max_tokens]", str(MAX_TOKENS))
    page.fill("#settings-form [name=temperature]", "0")
    page.click("#settings-save")
    page.evaluate(
        "() => { window.first = null; new MutationObserver(() => {"
        " const b = document.querySelector('#log article.assistant:last-child > .body');"
        " if (b && b.textContent.length && window.first === null) window.first = performance.now();"
        " }).observe(document.getElementById('log'), {childList: true, subtree: true}); }"
    )
    page.fill("#input", PROMPT)
    sent = page.evaluate("performance.now()")
    page.keyboard.press("Enter")
    page.wait_for_function("() => window.first !== null", timeout=60_000)
    first = page.evaluate("window.first")
    page.wait_for_selector("#send:not([hidden])", timeout=60_000)
    context.close()
    return (first - sent) / 1000


def client_ttft(url: str) -> float:
    client = openai.OpenAI(base_url=url + "/v1", api_key="none")
    began = time.perf_counter()
    stream = client.chat.completions.create(
        model="",
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
    )
    first = None
    for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - began
    return first if first is not None else float("nan")


def screenshots(browser: object, url: str, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, width, height in (("webui-desktop.png", 1100, 640), ("webui-phone.png", 390, 760)):
        context = browser.new_context(viewport={"width": width, "height": height}, color_scheme="light")  # type: ignore[attr-defined]
        page = context.new_page()
        page.goto(url)
        page.wait_for_selector("body[data-ready=true]")
        if width < 720:  # a phone: the list opens from its button
            page.click("#open-side")
        page.locator("#chats button").first.click()
        page.wait_for_selector("#log article.assistant")
        page.wait_for_timeout(300)  # the list folded away
        page.screenshot(path=str(folder / name))
        context.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--screenshots", type=Path)
    args = parser.parse_args()
    chromium = (
        os.environ.get("RUNNER_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    )
    if chromium is None:
        raise SystemExit("no Chromium: apt-get install chromium (or RUNNER_CHROMIUM=PATH)")
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start(args.model, Path(tmp) / "data")
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
                loads = [first_load(browser, url) for _ in range(args.rounds)]
                page_ttft(browser, url), client_ttft(url)  # warm-up: the model's first answer, the caches
                pages, clients = [], []
                for _ in range(args.rounds):
                    pages.append(page_ttft(browser, url))
                    clients.append(client_ttft(url))
                if args.screenshots:
                    screenshots(browser, url, args.screenshots)
                browser.close()
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
    sent, requests = loads[0][0], loads[0][1]
    ready = statistics.median(r for _, _, r in loads)
    page_s, client_s = statistics.median(pages), statistics.median(clients)
    print(f"| first load, transferred | {sent / 1000:.1f} KB in {requests} requests |")
    print(f"| first load to ready (median of {args.rounds}) | {ready * 1000:.0f} ms |")
    print(f"| TTFT in the page (median) | {page_s * 1000:.0f} ms |")
    print(f"| TTFT, openai client (median) | {client_s * 1000:.0f} ms |")
    print(f"| page / client | {page_s / client_s:.2f}x (target <= 1.1x) |")


if __name__ == "__main__":
    main()
