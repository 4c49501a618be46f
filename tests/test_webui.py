"""The chat page's server side, in process: the real app over a stand-in backend (no model), the real
store in the test's own data folder. The page and its files, the conversation API (a turn streamed
and kept, rename, export, delete, regenerate, edit), the key, the terminal's lock, and bad requests
(4xx, never a 500). The browser tests are tests/test_webui_browser.py."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from serving import MODEL, Scripted, StandIn, outcome_of
from starlette.testclient import TestClient

from runner.serve.app import create_app
from runner.serve.webui.conversations import Conversations
from runner.serve.webui.turns import Turn
from runner.store import Store, StoredMessage
from runner.store.file import transcript
from runner.store.turns import holding

KEY = "s3cret-key"
JSON = {"Content-Type": "application/json"}


@pytest.fixture
def store(_own_data_dir: Path) -> Iterator[Conversations]:
    kept = Conversations()
    yield kept
    kept.close()


def client(backend: StandIn, store: Conversations | None, **kwargs: Any) -> TestClient:
    return TestClient(create_app(backend, webui=store, log=lambda line: None, **kwargs))


def events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def turn(http: TestClient, **body: Any) -> list[dict[str, Any]]:
    got = http.post("/runner/v1/turns", content=json.dumps(body), headers=JSON)
    assert got.status_code == 200, got.text
    assert got.headers["content-type"].startswith("application/x-ndjson")
    return events(got.text)


def test_the_page_its_files_and_its_policy(store: Conversations) -> None:
    with client(StandIn(), store) as http:
        assert http.get("/").text == "runner is running"  # Ollama's clients probe / for this
        page = http.get("/", headers={"Accept": "text/html,application/xhtml+xml"})
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        csp = page.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "default-src 'none'" in csp and "http" not in csp
        assert page.headers["cache-control"] == "no-cache"
        assert "<script>" not in page.text and " style=" not in page.text  # nothing inline
        assets = re.findall(r'(?:src|href)="([^"]+)"', page.text)
        assert len(assets) == 4 and all(a.startswith("/runner/static/") for a in assets)  # nothing remote
        total = len(page.content)
        for path in assets:
            got = http.get(path, headers={"Accept-Encoding": "gzip"})
            assert got.status_code == 200, path
            assert got.headers["cache-control"] == "public, max-age=31536000, immutable"
            assert got.headers["content-encoding"] == "gzip"
            assert "https://" not in got.text.replace("https?:", "")  # no CDN, no font from elsewhere
            total += int(got.headers["content-length"])
        assert total < 300_000  # the bound for a first load, gzipped
        assert http.get("/runner/static/app.0000.js").status_code == 404
        plain = http.get(assets[-1], headers={"Accept-Encoding": "identity"})
        assert "content-encoding" not in plain.headers and b"RunnerMarkdown" in plain.content


def test_a_turn_is_streamed_and_kept_in_the_store(store: Conversations) -> None:
    backend = StandIn(outcome=outcome_of("Hello there", prompt_tokens=5, completion_tokens=2, reasoning="hm"))
    with client(backend, store) as http:
        got = turn(http, content="Hi", system="Be brief.", settings={"temperature": 0.2, "max_tokens": 9})
        kinds = [e["type"] for e in got]
        assert kinds == ["start", "answer", "answer", "done", "end"]
        number = got[0]["conversation"]
        assert got[0]["user"]["content"] == "Hi" and got[3]["message"]["content"] == "Hello there"
        assert backend.asks[0].messages == [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
        ]
        assert backend.asks[0].sampling == {"temperature": 0.2} and backend.asks[0].max_tokens == 9
        kept = Store.open().load(number)  # what runner chat --resume and runner history read
        assert kept is not None and kept.system == "Be brief." and kept.model == MODEL
        assert kept.settings == {"temperature": 0.2, "max_tokens": 9}
        assert [(m.role, m.content) for m in kept.messages] == [("user", "Hi"), ("assistant", "Hello there")]
        assert kept.messages[1].reasoning == "hm" and kept.messages[1].stats["completion_tokens"] == 2

        listed = http.get("/runner/v1/conversations").json()["conversations"]
        assert [(c["id"], c["title"], c["turns"]) for c in listed] == [(number, "Hi", 1)]
        read = http.get(f"/runner/v1/conversations/{number}").json()
        assert read["served_model"] == MODEL and [m["role"] for m in read["messages"]] == [
            "user",
            "assistant",
        ]

        change = {"title": "Greetings", "settings": {"top_k": 5}}
        assert http.patch(f"/runner/v1/conversations/{number}", json=change).status_code == 200
        again = Store.open().load(number)
        assert again is not None and again.title == "Greetings" and again.settings == {"top_k": 5}

        md = http.get(f"/runner/v1/conversations/{number}/export?format=md")
        assert md.text == transcript(again) and "attachment" in md.headers["content-disposition"]
        assert http.get(f"/runner/v1/conversations/{number}/export?format=pdf").status_code == 400
        data = http.get(f"/runner/v1/conversations/{number}/export?format=json").json()
        assert data["format"] == "runner-conversation" and data["title"] == "Greetings"

        assert http.delete(f"/runner/v1/conversations/{number}").status_code == 200
        assert Store.open().load(number) is None
        assert http.get(f"/runner/v1/conversations/{number}").status_code == 404


def test_regenerate_and_edit_replace_the_last_exchange(store: Conversations) -> None:
    backend = StandIn()
    with client(backend, store) as http:
        number = turn(http, content="First")[0]["conversation"]
        turn(http, conversation=number, content="Second")
        got = turn(http, conversation=number, action="regenerate")
        assert got[0]["user"] is None
        assert [m["content"] for m in backend.asks[-1].messages or []] == ["First", "Hello there", "Second"]
        kept = Store.open().load(number)
        assert kept is not None and [m.content for m in kept.messages].count("Hello there") == 2
        assert len(kept.messages) == 4

        turn(http, conversation=number, action="edit", content="Second, edited")
        kept = Store.open().load(number)
        assert kept is not None
        assert [m.content for m in kept.messages] == ["First", "Hello there", "Second, edited", "Hello there"]


def test_a_conversation_of_the_terminal_continues_in_the_page(store: Conversations) -> None:
    """A stored chat with a tool step (as `runner chat --mcp` keeps one) goes to the model as the
    template reads it: the call, its result answering it."""
    kept = Store.open()
    number = kept.new_conversation(MODEL, None)
    call = {"id": "call_1", "name": "get_time", "arguments": {"zone": "UTC"}}
    kept.add_message(number, StoredMessage("user", "What time is it?"))
    kept.add_message(number, StoredMessage("assistant", "", tool_calls=(call,)))
    kept.add_message(number, StoredMessage("tool", "12:00", call_id="call_1", tool="get_time"))
    kept.add_message(number, StoredMessage("assistant", "It is noon."))
    backend = StandIn()
    with client(backend, store) as http:
        read = http.get(f"/runner/v1/conversations/{number}").json()
        assert read["messages"][1]["tool_calls"] == [call] and read["messages"][2]["tool"] == "get_time"
        turn(http, conversation=number, content="Thanks")
    sent = backend.asks[0].messages or []
    assert sent[1]["tool_calls"][0]["function"] == {"name": "get_time", "arguments": {"zone": "UTC"}}
    assert sent[2] == {"role": "tool", "content": "12:00", "tool_call_id": "call_1", "name": "get_time"}


def test_a_turn_waits_for_the_terminal_holding_the_conversation(store: Conversations) -> None:
    kept = Store.open()
    number = kept.new_conversation(MODEL, None)
    kept.add_message(number, StoredMessage("user", "Hi"))
    done: list[float] = []
    with client(StandIn(), store) as http:

        def post() -> None:
            turn(http, conversation=number, content="Again")
            done.append(time.monotonic())

        with holding(kept, number):  # a `runner chat` in the middle of its turn
            poster = threading.Thread(target=post)
            poster.start()
            time.sleep(0.6)
            assert not done  # it waits: the turns do not interleave
            kept.add_message(number, StoredMessage("assistant", "Hello from the terminal"))
            released = time.monotonic()
        poster.join(10)
        assert done and done[0] >= released
    contents = [m.content for m in (kept.load(number) or pytest.fail()).messages]
    assert contents == ["Hi", "Hello from the terminal", "Again", "Hello there"]


def test_the_key_guards_the_api_not_the_page(store: Conversations) -> None:
    with client(StandIn(), store, api_key=KEY) as http:
        page = http.get("/", headers={"Accept": "text/html"})
        assert page.status_code == 200
        asset = re.findall(r'src="([^"]+)"', page.text)[0]
        assert http.get(asset).status_code == 200
        assert http.get("/runner/v1/conversations").status_code == 401
        assert http.post("/runner/v1/turns", json={"content": "Hi"}).status_code == 401
        ok = http.get("/runner/v1/conversations", headers={"Authorization": f"Bearer {KEY}"})
        assert ok.status_code == 200 and ok.json() == {"conversations": []}


def test_no_webui(store: Conversations) -> None:
    with client(StandIn(), None) as http:
        assert http.get("/", headers={"Accept": "text/html"}).text == "runner is running"
        assert http.get("/runner/v1/conversations").status_code == 404
        assert http.get("/runner/static/app.js").status_code == 404


BAD = [  # (method, path, body, content type, status, what the message says)
    ("POST", "/runner/v1/turns", "content=Hi", "application/x-www-form-urlencoded", 415, "must be JSON"),
    ("POST", "/runner/v1/turns", "{", "application/json", 400, "not valid JSON"),
    ("POST", "/runner/v1/turns", "[]", "application/json", 400, "object"),
    ("POST", "/runner/v1/turns", '{"content": 5}', "application/json", 400, "content"),
    ("POST", "/runner/v1/turns", '{"content": ""}', "application/json", 400, "empty"),
    ("POST", "/runner/v1/turns", '{"content": "Hi", "model": "nope"}', "application/json", 404, "not served"),
    (
        "POST",
        "/runner/v1/turns",
        '{"content": "Hi", "conversation": 0}',
        "application/json",
        400,
        "conversation",
    ),
    (
        "POST",
        "/runner/v1/turns",
        '{"content": "Hi", "conversation": 77}',
        "application/json",
        404,
        "no conver",
    ),
    ("POST", "/runner/v1/turns", '{"content": "Hi", "path": "/etc"}', "application/json", 400, "path"),
    ("POST", "/runner/v1/turns", '{"action": "regenerate"}', "application/json", 400, "no message"),
    ("POST", "/runner/v1/turns", '{"content": "Hi", "action": "undo"}', "application/json", 400, "action"),
    (
        "POST",
        "/runner/v1/turns",
        '{"content": "x", "images": ["http://a/b.png"]}',
        "application/json",
        400,
        "no images",
    ),
    (
        "POST",
        "/runner/v1/turns",
        '{"content": "Hi", "settings": {"temperature": "hot"}}',
        "application/json",
        400,
        "temperature",
    ),
    (
        "POST",
        "/runner/v1/turns",
        '{"content": "Hi", "settings": {"temperature": 9}}',
        "application/json",
        400,
        "temperature",
    ),
    (
        "POST",
        "/runner/v1/turns",
        '{"content": "Hi", "settings": {"max_tokens": 0}}',
        "application/json",
        400,
        "max_tokens",
    ),
    ("POST", "/runner/v1/turns", json.dumps({"content": "x" * 5000}), "application/json", 400, "context"),
    ("GET", "/runner/v1/conversations/abc", None, None, 404, "no conversation"),
    ("GET", "/runner/v1/conversations/%C2%B2", None, None, 404, "no conversation"),  # "²".isdigit()
    (
        "POST",
        "/runner/v1/turns",
        '{"content": "Hi", "conversation": 99999999999999999999}',
        "application/json",
        400,
        "conversation",
    ),
    ("GET", "/runner/v1/conversations/99999999999999999999999", None, None, 404, "no conversation"),
    ("GET", "/runner/v1/conversations/1/export?format=pdf", None, None, 404, "no conversation"),
    ("PATCH", "/runner/v1/conversations/1", '{"title": "x"}', "text/plain", 415, "must be JSON"),
    ("PATCH", "/runner/v1/conversations/1", '{"title": 3}', "application/json", 400, "title"),
    ("DELETE", "/runner/v1/conversations/5", None, None, 404, "no conversation"),
    ("GET", "/runner/v1/images/..%2F..%2Fetc%2Fpasswd", None, None, 404, "no such"),
    ("GET", "/runner/v1/images/" + "0" * 64, None, None, 404, "no such image"),
    ("POST", "/runner/v1/conversations/1/stop", "", "text/plain", 415, "must be JSON"),
    ("PUT", "/runner/v1/turns", "{}", "application/json", 405, "not allowed"),
]


@pytest.mark.parametrize(("method", "path", "content", "kind", "status", "says"), BAD)
def test_bad_requests_are_4xx(
    store: Conversations,
    method: str,
    path: str,
    content: str | None,
    kind: str | None,
    status: int,
    says: str,
) -> None:
    with client(StandIn(), store) as http:
        headers = {"Content-Type": kind} if kind else {}
        got = http.request(method, path, content=content, headers=headers)
        assert got.status_code == status, got.text
        error = got.json()["error"]
        assert says in error["message"], error
        assert http.get("/runner/v1/conversations").status_code == 200


def test_an_answer_to_a_conversation_deleted_meanwhile_is_said_not_raised(store: Conversations) -> None:
    with client(StandIn(), store) as http:
        number = turn(http, content="Hi")[0]["conversation"]
        Store.open().remove(number)  # `runner history rm` while the page holds it open
        got = http.post("/runner/v1/turns", json={"conversation": number, "content": "Again"})
        assert got.status_code == 404 and "no conversation" in got.json()["error"]["message"]


def test_an_answer_whose_conversation_went_meanwhile_is_said_not_raised(_own_data_dir: Path) -> None:
    """The conversation removed while its answer came (`runner history rm`, the page's Delete): the
    turn ends with an error event, the lock given back, nothing raised."""

    async def answer() -> list[dict[str, Any]]:
        kept = Conversations()
        try:
            held = await kept.hold(41)
            turn = Turn(41, Scripted([("answer", "Hi")], outcome_of("Hi")), held, kept, MODEL)
            await turn.run()
            with holding(Store.open(), 41):  # given back: a terminal takes it at once
                pass
            return turn.events
        finally:
            kept.close()

    got = asyncio.run(answer())
    assert [e["type"] for e in got] == ["answer", "error", "end"]
    assert "not kept" in got[1]["message"]
