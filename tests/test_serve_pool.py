"""runner serve without MODELS: every cached model and each .gguf of --models DIR, loaded on its first
request within the memory budget, unloaded when idle past its keep-alive or to make room."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

import httpx
import pytest

from tests.serving import serving

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
