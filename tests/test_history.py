"""`runner history show` in process: a served response's images shown as the chat shows a turn's
(`[image …]`: format and size), never their base64 and never a Python repr; its --json keeps them
whole. The items are made as /v1/responses keeps them (runner.serve.responses.input.stored)."""

from __future__ import annotations

import base64
import io
import json

import pytest

from runner.commands.history import image_label, show_conversation
from runner.serve.responses.input import input_items, stored
from runner.store import Store, StoredResponse
from tests.helpers import random_png

pytestmark = pytest.mark.fast


def test_a_served_image_is_shown_by_its_format_and_size_never_its_bytes() -> None:
    png = random_png(3)
    data = base64.b64encode(png).decode()
    asked = [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "What is in it?"},
                {"type": "input_image", "image_url": f"data:image/png;base64,{data}"},
            ],
        }
    ]
    answer = [
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "A cat."}]}
    ]
    conversation = stored(input_items(asked) + input_items(answer, "output"))
    store = Store.open()
    try:
        store.save_response(
            StoredResponse("resp_1", "smolvlm", 100.0, None, {"id": "resp_1"}, [], conversation)
        )
    finally:
        store.close()
    out = io.StringIO()
    show_conversation("resp_1", out=out)
    text = out.getvalue()
    size = f"{len(png) / 1000:.1f} KB"
    assert f"user: What is in it? [image PNG, {size}]\n" in text and "assistant: A cat.\n" in text
    assert data[:40] not in text and "{'type'" not in text and "base64" not in text
    whole = io.StringIO()
    show_conversation("resp_1", out=whole, as_json=True)
    assert data in json.loads(whole.getvalue())["conversation"][0]["content"][1]["image_url"]


@pytest.mark.parametrize(
    ("url", "label"),
    [
        ("data:image/jpeg;base64," + base64.b64encode(b"x" * 3000).decode(), "[image JPEG, 3.0 KB]"),
        (base64.b64encode(b"x" * 10).decode(), "[image 10 B]"),  # bare base64: no media type to name
        ("data:image/webp;base64", "[image WEBP]"),  # no comma, no data
        (None, "[image]"),
    ],
)
def test_an_image_label_says_what_the_text_says(url: object, label: str) -> None:
    assert image_label(url) == label
