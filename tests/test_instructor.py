"""The real `instructor` client (the most used structured-output library) against a real `runner serve`
of the test model: its JSON_SCHEMA and TOOLS modes, with issue 35's Pydantic models (ranges,
max_length, Literal; a list of models, an Optional, a datetime), each answered with a valid object on
the first try (max_retries=0: a retry would hide an answer that did not validate). instructor checks
what comes back with the Pydantic model itself, so a returned object is the proof. (Its JSON mode
sends no schema, only `json_object` and the schema as text in a message: any object is enforced,
and what fills it is up to the model; it is answered, not refused, as before.)"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Literal, Optional, TypeVar

import instructor
import openai
import pytest
from pydantic import BaseModel, Field

from tests.serving import serving


class User(BaseModel):
    name: str = Field(max_length=30)
    age: int = Field(ge=0, le=120)
    role: Literal["admin", "user"]


class Address(BaseModel):
    street: str
    city: str


class Person(BaseModel):
    name: str
    birthday: datetime
    nickname: Optional[str] = None
    addresses: list[Address] = Field(min_length=1)


ASK_USER = "Jason is a 25 year old administrator."
ASK_PERSON = "Ada was born on 10 December 1815 and lived at 12 St James's Square, London."


@pytest.fixture(scope="module")
def base_url(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("instructor") / "stderr"
    with serving(["smollm2", "--parallel", "1", "--threads", "2"], log) as server:
        yield f"{server.url}/v1"


M = TypeVar("M", bound=BaseModel)


def extract(base_url: str, mode: instructor.Mode, model: type[M], text: str, max_tokens: int) -> M:
    """`model` filled from `text` by instructor in `mode`, greedy, on the first try or not at all."""
    raw = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    return instructor.from_openai(raw, mode=mode).chat.completions.create(
        model="smollm2",
        response_model=model,
        messages=[{"role": "user", "content": text}],
        max_retries=0,
        max_tokens=max_tokens,
        temperature=0,
    )


@pytest.mark.parametrize("mode", [instructor.Mode.JSON_SCHEMA, instructor.Mode.TOOLS])
def test_a_model_with_ranges_a_max_length_and_a_literal(base_url: str, mode: instructor.Mode) -> None:
    user = extract(base_url, mode, User, ASK_USER, 200)
    assert isinstance(user, User) and 0 <= user.age <= 120 and len(user.name) <= 30


@pytest.mark.parametrize("mode", [instructor.Mode.JSON_SCHEMA, instructor.Mode.TOOLS])
def test_a_nested_model_with_a_list_an_optional_and_a_datetime(base_url: str, mode: instructor.Mode) -> None:
    person = extract(base_url, mode, Person, ASK_PERSON, 1000)
    assert isinstance(person, Person) and person.addresses and isinstance(person.birthday, datetime)
