"""The planner and `runner fit`: the real SmolLM2 header, machines of hand-picked sizes."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from runner import ui
from runner.errors import InvalidSetting, WontFit
from runner.gguf import read_header
from runner.loader import plan_for
from runner.memory.devices import Gpu, Machine
from runner.memory.estimate import Load, estimate
from runner.memory.plan import CPU_MARGIN, Ask, departures, make_plan
from runner.settings import LoadSettings
from tests.conftest import run_cli

GB = 10**9
MB = 10**6


@pytest.fixture(scope="module")
def header(smollm2_path: Path):
    return read_header(smollm2_path)


def cpu_machine(available: int) -> Machine:
    return Machine(ram_total_bytes=64 * GB, ram_available_bytes=available)


def gpu_machine(free: int, ram: int = 64 * GB) -> Machine:
    gpu = Gpu(0, "Test GPU", free + 1 * GB, free, "cuda", "nvml", bandwidth=1e12)
    return Machine(ram, ram, (gpu,), can_offload=True)


@pytest.mark.model
def test_cpu_plan_takes_the_trained_context_up_to_the_cap(header) -> None:
    plan = make_plan(header, cpu_machine(16 * GB))
    assert (plan.n_ctx, plan.n_gpu_layers, plan.fits) == (8192, 0, True)
    assert plan.verdicts[0].budget_bytes == int(16 * GB * (1 - CPU_MARGIN))


def room_for(header, n_ctx: int, kv: str = "f16", **kw) -> int:
    """RAM available that holds exactly this, after the margin."""
    need = estimate(header, Load(n_ctx=n_ctx, type_k=kv, type_v=kv, **kw)).host_rss_bytes
    return int(need / (1 - CPU_MARGIN)) + 1


@pytest.mark.model
def test_without_ctx_a_smaller_machine_gets_a_quantized_cache_before_a_smaller_context(header) -> None:
    machine = cpu_machine(room_for(header, 8192, "q8_0"))
    assert machine.ram_available_bytes < room_for(header, 8192)  # f16 at 8192 does not fit
    plan = make_plan(header, machine)
    assert plan.fits and (plan.n_ctx, plan.type_k, plan.type_v) == (8192, "q8_0", "q8_0")
    chose = departures(plan, header, machine, ctx=None, gpu_layers=None, kv_type=None)
    assert chose == ["a q8_0 KV cache (f16 would not fit)"]


@pytest.mark.model
def test_without_ctx_a_still_smaller_machine_gets_a_smaller_context(header) -> None:
    available = room_for(header, 4096)
    assert available < room_for(header, 8192, "q8_0")
    plan = make_plan(header, cpu_machine(available))
    assert plan.fits and (plan.n_ctx, plan.type_k) == (4096, "f16")  # f16 first at each context
    chose = departures(plan, header, cpu_machine(available), ctx=None, gpu_layers=None, kv_type=None)
    assert chose == ["a 4,096-token context (8,192 would not fit)"]


@pytest.mark.model
def test_an_explicit_kv_type_is_kept(header) -> None:
    machine = cpu_machine(room_for(header, 8192, "q8_0"))
    plan = make_plan(header, machine, Ask(kv_type="f16"))
    assert plan.fits and (plan.n_ctx, plan.type_k) == (4096, "f16")
    assert make_plan(header, machine, Ask(ctx=8192, kv_type="f16")).fits is False


@pytest.mark.fast
def test_a_model_without_flash_attention_never_gets_a_quantized_cache() -> None:
    from tests.helpers import llama_like

    odd = llama_like(n_head=12, n_head_kv=4)  # head size 48: no CUDA flash attention, so no q8_0 V
    full = estimate(odd, Load(n_ctx=8192, n_gpu_layers=-1, gpu=True)).device("gpu")
    assert full is not None
    machine = gpu_machine(full.total_bytes)  # less the margin: not every layer fits
    plan = make_plan(odd, machine)
    assert plan.fits and plan.type_k == "f16" and 0 < plan.n_gpu_layers < plan.estimate.n_layers
    with pytest.raises(InvalidSetting, match="flash attention"):  # asked for: an error, not a skip
        make_plan(odd, machine, Ask(kv_type="q8_0"))


@pytest.mark.model
def test_what_will_not_fit_is_refused_with_options_that_do(header) -> None:
    machine = cpu_machine(int(estimate(header, Load(n_ctx=2048)).host_rss_bytes / (1 - CPU_MARGIN)) + MB)
    plan = make_plan(header, machine, Ask(ctx=8192))
    assert not plan.fits
    assert plan.alternatives and plan.alternatives[0].startswith("--ctx ")
    smaller = int(plan.alternatives[0].split()[1])
    assert 2048 <= smaller < 8192 and smaller % 256 == 0
    assert make_plan(header, machine, Ask(ctx=smaller)).fits
    assert any(a.startswith("--kv-type q8_0") for a in plan.alternatives)


@pytest.mark.model
def test_a_small_gpu_gets_a_quantized_cache_before_losing_layers(header) -> None:
    q8 = estimate(header, Load(n_ctx=8192, n_gpu_layers=-1, gpu=True, type_k="q8_0", type_v="q8_0"))
    f16 = estimate(header, Load(n_ctx=8192, n_gpu_layers=-1, gpu=True))
    free = q8.device("gpu").total_bytes + (256 << 20) + MB  # the 256 MiB margin of a small GPU
    assert f16.device("gpu").total_bytes > free - (256 << 20)
    plan = make_plan(header, gpu_machine(free))
    assert plan.fits and plan.full_offload and (plan.n_ctx, plan.type_k) == (8192, "q8_0")


@pytest.mark.model
def test_the_engine_loads_the_planned_kv_cache_and_says_so(
    smollm2_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from runner.engine.llamacpp import LLAMA_LOG
    from runner.loader import open_model
    from runner.memory import devices

    header = read_header(smollm2_path)
    monkeypatch.setattr(devices, "probe", lambda **_: cpu_machine(room_for(header, 8192, "q8_0")))
    log: list[str] = []
    LLAMA_LOG.listeners.append(lambda _level, text: log.append(text))
    try:
        loaded = open_model(str(smollm2_path))
    finally:
        LLAMA_LOG.listeners.pop()
    with loaded.engine:
        assert loaded.engine.context.n_ctx == 8192
    kv_lines = [line for line in log if "llama_kv_cache: size" in line]
    assert kv_lines and "K (q8_0)" in kv_lines[-1] and "V (q8_0)" in kv_lines[-1], kv_lines
    assert "runs with a q8_0 KV cache (f16 would not fit)" in capsys.readouterr().err


@pytest.mark.model
def test_plan_for_refuses_unless_forced(header, monkeypatch: pytest.MonkeyPatch) -> None:
    from runner.memory import devices

    monkeypatch.setattr(devices, "probe", lambda **_: cpu_machine(100 * MB))
    with pytest.raises(WontFit, match=r"smollm2 does not fit in RAM at a 8,192-token context \(CPU needs"):
        plan_for(header, "smollm2")
    forced = plan_for(header, "smollm2", LoadSettings(force=True))
    assert not forced.fits and forced.n_ctx == 8192


@pytest.mark.model
def test_a_gpu_with_room_takes_every_layer(header) -> None:
    plan = make_plan(header, gpu_machine(8 * GB))
    assert plan.fits and plan.full_offload and plan.n_gpu_layers == 31  # 30 blocks + the output layer
    assert {v.device for v in plan.verdicts} == {"cpu", "gpu"}


@pytest.mark.model
def test_a_small_gpu_gets_the_most_layers_that_fit(header) -> None:
    full = estimate(header, Load(n_ctx=8192, n_gpu_layers=-1, gpu=True)).device("gpu")
    half = estimate(header, Load(n_ctx=8192, n_gpu_layers=15, gpu=True)).device("gpu")
    assert full is not None and half is not None
    free = half.total_bytes + 256 * 2**20 + 3 * MB  # the margin, and room for a layer or so more
    plan = make_plan(header, gpu_machine(free), Ask(ctx=8192))
    assert plan.fits and 15 <= plan.n_gpu_layers < 31
    more = estimate(header, Load(n_ctx=8192, n_gpu_layers=plan.n_gpu_layers + 1, gpu=True)).device("gpu")
    assert more is not None and more.total_bytes > free - 256 * 2**20


@pytest.mark.model
def test_a_gpu_with_no_room_falls_back_to_the_cpu(header) -> None:
    plan = make_plan(header, gpu_machine(10 * MB), Ask(ctx=2048))
    assert plan.fits and plan.n_gpu_layers == 0


def test_fit_json_has_the_documented_fields() -> None:
    done = run_cli("fit", "smollm2", "--json", "--ctx", "4096")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert {"model", "ctx", "gpu_layers", "fits", "estimate", "devices"} <= set(report)
    assert set(report["estimate"]) >= {
        "weights_bytes",
        "kv_bytes",
        "compute_bytes",
        "output_bytes",
        "total_bytes",
    }
    assert report["model"] == "smollm2" and report["ctx"] == 4096 and report["fits"] is True
    # the KV cache of SmolLM2 at 4096: 30 layers x 3 KV heads x 64 dims x (K+V) x 2 bytes x 4096 cells
    assert report["estimate"]["kv_bytes"] == 30 * 3 * 64 * 2 * 2 * 4096
    assert report["devices"][0]["device"] == "cpu"
    assert report["chosen"] == []  # nothing this machine forced on the plan


@pytest.mark.model
def test_fit_says_what_it_chose_for_a_small_machine(
    smollm2_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import io

    from runner.commands.fit import Request, fit_model
    from runner.memory import devices

    header = read_header(smollm2_path)
    monkeypatch.setattr(devices, "probe", lambda **_: cpu_machine(room_for(header, 8192, "q8_0")))
    text, report = io.StringIO(), io.StringIO()
    fit_model(Request(str(smollm2_path)), out=text)
    fit_model(Request(str(smollm2_path), as_json=True), out=report)
    assert re.search(r"^KV cache type +q8_0$", text.getvalue(), re.M)
    assert "chosen for this machine: a q8_0 KV cache (f16 would not fit)" in text.getvalue()
    assert json.loads(report.getvalue())["chosen"] == ["a q8_0 KV cache (f16 would not fit)"]
    assert json.loads(report.getvalue())["kv_type"] == "q8_0"


def test_fit_table_and_run_refusal_for_a_context_too_large() -> None:
    done = run_cli("fit", "smollm2", "--ctx", "50000000")
    assert done.returncode == 0
    out = done.stdout.decode()
    assert "verdict: does not fit" in out and "would fit: --ctx 8192" in out
    refused = run_cli("run", "smollm2", "hi", "--ctx", "50000000")
    assert refused.returncode == 1
    err = refused.stderr.decode()
    assert "does not fit in RAM" in err and "try --ctx 8192" in err and "Traceback" not in err
    assert refused.stdout == b""


def test_fit_reads_a_remote_repo_per_quant_without_downloading(tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.fakehub import FakeHub, hf_env
    from tests.synth import write_gguf

    q4 = write_gguf(tmp_path / "q4.gguf", layers=2, padding=8_000_000)
    q8 = write_gguf(tmp_path / "q8.gguf", layers=3, padding=8_000_000)
    with FakeHub() as hub:
        hub.add_repo("user/tiny-GGUF", {"tiny-Q4_K_M.gguf": q4, "tiny-Q8_0.gguf": q8, "mmproj-x.gguf": q4})
        env = hf_env(hub.endpoint, tmp_path / "hf")

        def fit(*args: str) -> subprocess.CompletedProcess[bytes]:
            return subprocess.run(
                [sys.executable, "-m", "runner", "fit", *args], env=env, capture_output=True, timeout=120
            )

        rows = fit("user/tiny-GGUF", "--json")
        assert rows.returncode == 0, rows.stderr
        report = json.loads(rows.stdout)
        assert [r["quant"] for r in report] == ["Q4_K_M", "Q8_0"]
        assert all(r["fits"] and r["largest_ctx"] == 4096 for r in report)  # the trained context
        assert [r["size_bytes"] for r in report] == [q4.stat().st_size, q8.stat().st_size]
        table = fit("hf.co/user/tiny-GGUF").stdout.decode().splitlines()
        assert table[0].split() == ["quant", "size", "verdict", "largest", "context", "file"]
        assert table[1].split()[0] == "Q4_K_M" and "fits, CPU only" in table[1]
        one = fit("user/tiny-GGUF:Q8_0", "--json", "--ctx", "1024")
        assert json.loads(one.stdout)["ctx"] == 1024
        # five header reads, each one 1 MiB block, while each file carries 8 MB of tensor data
        assert hub.sent("cdn-lfs") <= 5 * (1 << 20)
    assert not (tmp_path / "hf").exists() or not list((tmp_path / "hf").rglob("*.gguf"))


def exaone(tmp_path: Path) -> Path:
    """A llama-shaped model of an architecture the estimator has no graph for (Estimate.exact False)."""
    import synth

    spec = synth.Spec("exaone", n_layer=3, n_embd=256, n_head=4, n_head_kv=2, n_ff=768, n_vocab=6000)
    return synth.write_model(tmp_path / "exaone.gguf", spec)


@pytest.mark.model
def test_a_dry_run_gives_the_compute_buffers_the_estimate_replays(smollm2_path: Path) -> None:
    from runner.engine.llamacpp import Placement, dry_run, repack_types

    header = read_header(smollm2_path)
    for n_ctx, kv in ((2048, "f16"), (8192, "f16"), (4096, "q8_0")):
        real = dry_run(smollm2_path, Placement(0, use_gpu=False, kv_type=kv), n_ctx=n_ctx)
        est = estimate(header, Load(n_ctx=n_ctx, type_k=kv, type_v=kv), repack_types=repack_types())
        assert real is not None and set(real) == {"CPU"}
        assert real["CPU"] == pytest.approx(est.compute_bytes, abs=0.006 * 2**20), (n_ctx, kv)


@pytest.mark.model
def test_a_dry_run_of_a_file_llama_cpp_refuses_says_nothing(tmp_path: Path) -> None:
    from runner.engine.llamacpp import Placement, dry_run

    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 60)
    assert dry_run(bad, Placement(0, use_gpu=False), n_ctx=512) is None


@pytest.mark.model
def test_an_approximate_estimate_is_checked_by_a_dry_run(tmp_path: Path) -> None:
    from runner.loader import dry_run_of
    from runner.memory.plan import confirm

    path = exaone(tmp_path)
    header = read_header(path)
    plan = make_plan(header, cpu_machine(16 * GB))
    assert not plan.estimate.exact and not plan.estimate.compute_from_engine
    checked = confirm(plan, header, cpu_machine(16 * GB), dry_run_of(path))
    assert checked.estimate.compute_from_engine and checked.fits
    assert checked.estimate.compute_bytes == pytest.approx(plan.estimate.compute_bytes, abs=0.006 * 2**20)


@pytest.mark.model
def test_a_plan_a_dry_run_refutes_is_made_again_from_llama_cpps_figures(tmp_path: Path) -> None:
    from runner.engine.llamacpp import Placement, dry_run
    from runner.loader import dry_run_of
    from runner.memory.plan import confirm

    path = exaone(tmp_path)
    header = read_header(path)
    need = make_plan(header, cpu_machine(16 * GB)).estimate.host_rss_bytes  # at 8192, f16
    machine = cpu_machine(int((need - MB) / (1 - CPU_MARGIN)))  # 1 MB short of it
    hopeful = make_plan(header, machine, Ask(adjust={"CPU": -8 * MB}))  # as if the estimate were 8 MB low
    assert hopeful.fits and (hopeful.n_ctx, hopeful.type_k) == (8192, "f16")
    checked = confirm(hopeful, header, machine, dry_run_of(path))
    assert checked.fits and checked.estimate.compute_from_engine
    assert (checked.n_ctx, checked.type_k) != (8192, "f16")  # refuted: a plan that fits llama.cpp's figures
    real = dry_run(path, Placement(0, use_gpu=False, kv_type=checked.type_k), n_ctx=checked.n_ctx)
    assert real == {b.name: b.nbytes for b in checked.estimate.buffers if b.kind == "compute"}


@pytest.mark.model
def test_a_refusal_offers_only_what_fits_llama_cpps_own_figures(tmp_path: Path) -> None:
    """The options a refusal names are judged with the dry run's correction, as the plan was: a
    backend whose compute buffers exceed the estimate (as a GPU's may) gets a smaller --ctx offered."""
    from runner.loader import dry_run_of
    from runner.memory.plan import confirm

    path = exaone(tmp_path)
    header = read_header(path)
    real = dry_run_of(path)

    def dry(p):  # llama.cpp's real figures, 4 MB more compute than the estimate replays
        return {name: n + 4 * MB for name, n in real(p).items()}

    asked = Ask(ctx=8192, kv_type="f16")
    need = make_plan(header, cpu_machine(16 * GB), asked).estimate.host_rss_bytes
    machine = cpu_machine(int((need + MB) / (1 - CPU_MARGIN)))  # the estimate fits by 1 MB
    refused = confirm(make_plan(header, machine, asked), header, machine, dry, asked)
    assert not refused.fits
    offered = [int(a.split()[1]) for a in refused.alternatives if a.startswith("--ctx ")]
    assert offered and offered[0] < 8192 - 256  # not the estimate's 7936, which the dry run refutes
    retry = replace(asked, ctx=offered[0])
    assert confirm(make_plan(header, machine, retry), header, machine, dry, retry).fits


# -- flash attention: off for a chat on the CPU, where llama.cpp's kernel slows as the cache fills --


@pytest.mark.model
def test_a_growing_context_on_the_cpu_plans_without_flash_attention(header, monkeypatch) -> None:
    from runner.memory import devices

    monkeypatch.setattr(devices, "probe", lambda **_: cpu_machine(16 * GB))
    chat = plan_for(header, "smollm2", LoadSettings(growing=True))
    assert (chat.flash_attn, chat.type_k, chat.n_ctx) == (False, "f16", 8192)
    one_shot = plan_for(header, "smollm2")
    assert one_shot.flash_attn is None  # llama.cpp's auto
    assert chat.estimate.compute_bytes > one_shot.estimate.compute_bytes  # the attention scores
    asked = plan_for(header, "smollm2", LoadSettings(growing=True, flash_attn=True))  # --flash-attn on wins
    assert asked.flash_attn is True


@pytest.mark.model
def test_a_growing_context_keeps_flash_attention_where_only_a_quantized_cache_fits(
    header, monkeypatch
) -> None:
    from runner.memory import devices

    machine = cpu_machine(room_for(header, 8192, "q8_0"))  # f16 at 8192 does not fit
    monkeypatch.setattr(devices, "probe", lambda **_: machine)
    plan = plan_for(header, "smollm2", LoadSettings(growing=True))
    assert (plan.flash_attn, plan.type_k, plan.n_ctx) == (None, "q8_0", 8192)  # as a one-shot would


@pytest.mark.model
def test_a_growing_context_with_a_gpu_keeps_llama_cpp_s_auto(header, monkeypatch) -> None:
    from runner.memory import devices

    monkeypatch.setattr(devices, "probe", lambda **_: gpu_machine(8 * GB))
    assert plan_for(header, "smollm2", LoadSettings(growing=True)).flash_attn is None


@pytest.mark.model
def test_flash_attention_off_with_a_quantized_cache_is_refused(header) -> None:
    with pytest.raises(InvalidSetting, match="flash attention"):
        make_plan(header, cpu_machine(16 * GB), Ask(kv_type="q8_0", flash_attn=False))


def test_fit_reports_flash_attention(smollm2_path: Path) -> None:
    done = run_cli("fit", str(smollm2_path), "--flash-attn", "off", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["flash_attn"] == "off"
    bad = run_cli("fit", str(smollm2_path), "--flash-attn", "sometimes")
    assert bad.returncode == 2
    assert (
        bad.stderr.decode().strip() == "runner: error: --flash-attn must be auto, on or off (got 'sometimes')"
    )


def test_fit_parallel_counts_each_sequence_s_context(smollm2_path: Path) -> None:
    # as run --parallel: --ctx is each sequence's, the KV cache holds all of them
    one = json.loads(run_cli("fit", str(smollm2_path), "--ctx", "1024", "--json").stdout)
    four = json.loads(run_cli("fit", str(smollm2_path), "--ctx", "1024", "--parallel", "4", "--json").stdout)
    assert (one["ctx"], one["parallel"]) == (1024, 1)
    assert (four["ctx"], four["parallel"]) == (1024, 4)  # "ctx" is each sequence's, as --ctx is
    assert four["estimate"]["kv_bytes"] == 4 * one["estimate"]["kv_bytes"]
    # each sequence padded as one alone is: --ctx 1000 gives every sequence 1,024 cells
    padded = json.loads(
        run_cli("fit", str(smollm2_path), "--ctx", "1000", "--parallel", "4", "--json").stdout
    )
    assert padded["ctx"] == 1024 and padded["estimate"]["kv_bytes"] == four["estimate"]["kv_bytes"]


def test_fit_says_what_run_says_of_a_context_beyond_the_trained_one(smollm2_path: Path) -> None:
    fit = run_cli("fit", str(smollm2_path), "--ctx", "16000")
    run = run_cli("run", str(smollm2_path), "hi", "--ctx", "16000", "--max-tokens", "1")
    assert fit.returncode == 0 and run.returncode == 0, (fit.stderr, run.stderr)

    def warnings(done) -> list[str]:
        return [line for line in done.stderr.decode().splitlines() if line.startswith("runner: warning:")]

    beyond = "--ctx 16,000 is beyond the 8,192 tokens this model was trained on; answers may degrade"
    assert warnings(fit) == warnings(run) == [f"runner: warning: {beyond}"]
    # what llama.cpp makes of it is said too: not a silent 16,128
    assert "16,128 tokens (--ctx 16,000 padded to a multiple of 256; trained 8,192)" in fit.stdout.decode()
    report = json.loads(run_cli("fit", str(smollm2_path), "--ctx", "16000", "--json").stdout)
    assert report["warnings"] == [beyond]


def _bytes(cell: str) -> tuple[float, float]:
    """A table cell's first size, in bytes, and how far its rounding may be off."""
    value, unit = cell.split()[:2]
    scale = 1000 ** ["B", "KB", "MB", "GB", "TB"].index(unit)
    return float(value) * scale, (0.5 if unit == "B" else 0.05) * scale


@pytest.mark.parametrize("name", ["gemma3", "bigvocab"])
def test_fit_table_parts_add_up_to_what_each_device_needs(tmp_path: Path, name: str) -> None:
    import synth

    path = synth.write_model(tmp_path / f"{name}.gguf", synth.SPECS[name])
    done = run_cli("fit", str(path))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.decode().splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("device"))
    columns = re.split(r"  +", lines[head])
    assert columns[:7] == ["device", "weights", "KV cache", "compute", "output", "other", "needs"]
    row = dict(zip(columns, re.split(r"  +", lines[head + 1]), strict=False))
    parts = [_bytes(row[c]) for c in ("weights", "KV cache", "compute", "output", "other")]
    needs, off = _bytes(row["needs"])
    assert abs(sum(p for p, _ in parts) - needs) <= off + sum(e for _, e in parts), row
    report = json.loads(run_cli("fit", str(path), "--json").stdout)
    cpu = report["devices"][0]
    kinds = ("weights_bytes", "kv_bytes", "compute_bytes", "output_bytes", "other_bytes")
    assert sum(cpu[k] for k in kinds) == cpu["total_bytes"]
    if name == "bigvocab":  # a 200k vocabulary's logits: a large compute buffer, little of it held
        assert cpu["compute_bytes"] < cpu["compute_reserved_bytes"] / 10
        assert row["compute"].endswith(f" of {ui.human_bytes(cpu['compute_reserved_bytes'])}"), row


@pytest.mark.model
def test_a_batch_that_will_not_fit_is_told_its_context_per_sequence(
    header, monkeypatch: pytest.MonkeyPatch
) -> None:
    from runner.memory import devices

    machine = cpu_machine(room_for(header, 4 * 4096, n_seq=4))  # four sequences of 4096, not 8192
    monkeypatch.setattr(devices, "probe", lambda **_: machine)
    with pytest.raises(WontFit) as refused:
        plan_for(header, "smollm2", LoadSettings(ctx=8192, kv_type="f16", parallel=4))
    message = str(refused.value)
    assert "at a 8,192-token context for each of 4 sequences" in message, message
    offered = re.search(r"try --ctx (\d+)", message)
    assert offered, message
    ctx = int(offered[1])  # as --ctx means it: each sequence's
    assert 4096 <= ctx < 8192
    assert make_plan(header, machine, Ask(ctx=4 * ctx, kv_type="f16", n_seq=4)).fits


@pytest.mark.model
def test_layers_split_over_workers_as_llama_cpp_splits_them(header) -> None:
    from runner.memory.devices import Remote
    from runner.memory.split import layer_owners
    from runner.memory.weights import tensor_layer

    owners = layer_owners(30, 0, [1.0, 1.0])  # SmolLM2: 30 blocks and the output layer
    assert [list(owners.values()).count(i) for i in (0, 1)] == [16, 15]
    assert owners[30] == 1  # the output layer on the last worker
    assert layer_owners(30, 10, [3.0, 1.0]) == {il: 0 if il < 26 else 1 for il in range(10, 31)}
    workers = (Remote("10.0.0.1:50052", 1 << 30, 1 << 30), Remote("10.0.0.2:50052", 1 << 30, 1 << 30))
    small = Machine(1 << 34, 90_000_000, workers=workers)  # too little here for the model alone
    plan = make_plan(header, small, Ask(ctx=2048))
    assert plan.fits and plan.full_offload, plan.verdicts
    held = {d.device: d for d in plan.estimate.devices}
    assert set(held) == {"cpu", "10.0.0.1:50052", "10.0.0.2:50052"}
    offloaded = sum(t.nbytes for t in header.tensors if tensor_layer(t.name, 30) >= 0)
    tied = header.tensor("token_embd.weight").nbytes  # the output layer's copy of the tied embeddings
    on_workers = held["10.0.0.1:50052"].weights_bytes + held["10.0.0.2:50052"].weights_bytes
    assert offloaded + tied <= on_workers <= offloaded + tied + 64 * len(header.tensors)
    assert held["cpu"].kv_bytes == 0 and held["10.0.0.1:50052"].kv_bytes > 0
    alone = make_plan(header, Machine(1 << 34, 90_000_000), Ask(ctx=2048))
    assert not alone.fits


@pytest.mark.model
def test_with_small_workers_the_most_layers_they_hold_and_the_rest_here(header) -> None:
    from runner.memory.devices import Remote

    workers = (Remote("10.0.0.1:50052", 250_000_000, 250_000_000),)  # room for some layers only
    plan = make_plan(header, Machine(1 << 34, 4 << 30, workers=workers), Ask(ctx=2048))
    assert plan.fits and 0 < plan.n_gpu_layers < plan.estimate.n_layers, plan.n_gpu_layers
    more = make_plan(
        header, Machine(1 << 34, 4 << 30, workers=workers), Ask(ctx=2048, gpu_layers=plan.n_gpu_layers + 1)
    )
    assert not more.fits  # the most the worker holds
    departed = departures(
        plan, header, Machine(1 << 34, 4 << 30, workers=workers), ctx=2048, gpu_layers=None, kv_type=None
    )
    assert any("on the workers, the rest on this machine's CPU" in d for d in departed)


# -- issue 40: one figure for one plan, fit against serve; decode speed as measured here --------------


def test_fit_serve_fit_json_and_serve_s_refusal_give_one_figure(tmp_path: Path) -> None:
    """A gemma3 model at --parallel 4 --ctx 2048: `fit --serve` (table and --json) says to the byte
    what runner serve counts against its budget; `fit` alone counts the same plan less the two parts
    only a server adds, named; the server's refusal gives the same figure, its parts and the ways
    under the budget."""
    import httpx
    import synth

    from tests.serving import serving

    folder = tmp_path / "models"
    folder.mkdir()
    path = synth.write_model(folder / "gemma.gguf", synth.SPECS["gemma3"])
    flags = ["--parallel", "4", "--ctx", "2048"]
    served = json.loads(run_cli("fit", str(path), "--serve", *flags, "--json").stdout)
    plain = json.loads(run_cli("fit", str(path), *flags, "--json").stdout)
    table = run_cli("fit", str(path), "--serve", *flags).stdout.decode()
    plain_table = run_cli("fit", str(path), *flags).stdout.decode()
    needs = served["needs_bytes"]
    assert (served["parallel"], served["ctx"], plain["parallel"], plain["ctx"]) == (4, 2048, 4, 2048)
    assert needs == sum(d["total_bytes"] for d in served["devices"])
    assert f"needs: {needs / 1e6:,.0f} MB in all" in table
    assert f"needs: {plain['needs_bytes'] / 1e6:,.0f} MB in all" in plain_table
    # the JSON's estimate is llama.cpp's reservation (its compute buffer whole), and the table says so
    assert f"llama.cpp reserves: {plain['estimate']['total_bytes'] / 1e6:,.0f} MB" in plain_table
    # what a server adds, named: 64 rows of logits in the output buffer (4 without), the embedding context
    vocab = synth.SPECS["gemma3"].n_vocab
    assert served["serve"]["output_rows"] == 64 and plain["serve"] is None
    embedding = served["serve"]["embedding_bytes"]
    assert served["devices"][0]["embedding_bytes"] == embedding > 0
    assert needs - plain["needs_bytes"] == embedding + (64 - 4) * vocab * 4
    assert "--serve" in plain_table  # fit alone says that a server counts more
    args = ["--models", str(folder), *flags, "--threads", "1", "--memory", str(needs - 1)]
    with serving(args, tmp_path / "stderr") as server:
        body = {"model": "gemma", "messages": [{"role": "user", "content": "Hi"}], "stream": False}
        refused = httpx.post(f"{server.url}/api/chat", json=body, timeout=120)
    assert refused.status_code == 400, refused.text
    message = refused.json()["error"]
    assert f"gemma needs {needs / 1e6:,.0f} MB of cpu memory" in message, message
    assert f"may use {(needs - 1) / 1e6:,.0f} MB" in message, message
    for said in (
        "embedding context",
        "logprobs",
        f"runner fit {path} --serve",
        "--parallel",
        "--ctx",
        "--memory",
    ):
        assert said in message, message


@pytest.mark.model
def test_serve_plans_and_counts_as_the_loader_says_fit_serve_does(header) -> None:
    """runner serve's own planning options and price of a model are the loader's, which fit --serve
    shows: one definition, checked here while serve keeps a copy of its own."""
    from runner.commands import serve
    from runner.loader import choose_plan, machine, serve_needs, serve_planning

    here = machine()
    for parallel in (None, 2):
        asked = serve._planning(
            serve.ServeRequest(models=[], parallel=parallel, settings=LoadSettings(ctx=1024))
        )
        planning = {k: getattr(asked, k) for k in ("parallel", "most_parallel", "output_rows")}
        assert planning == serve_planning(parallel)
        plan, _ = choose_plan(header, here, asked)
        assert serve._needs(plan, header) == serve_needs(plan, header)


def test_fit_parallel_without_ctx_chose_no_smaller_context(smollm2_path: Path) -> None:
    """--parallel 2 without --ctx is two of 2,048 tokens, as run plans a batch: not "a 4,096-token
    context (8,192 would not fit)", which fit once said of it."""
    done = run_cli("fit", str(smollm2_path), "--parallel", "2")
    assert done.returncode == 0, done.stderr
    assert "2,048 tokens for each of 2 sequences" in done.stdout.decode()
    assert "chosen for this machine" not in done.stdout.decode(), done.stdout.decode()


def test_fit_shows_the_decode_speed_runner_bench_measured_here(smollm2_path: Path, tmp_path: Path) -> None:
    """fit's speed: an upper bound, said to be one, until `runner bench` has measured the model on this
    machine; then bench's tg128, said to be measured, and when."""
    env = {"RUNNER_HOME": str(tmp_path / "home")}
    before = json.loads(run_cli("fit", str(smollm2_path), "--json", env=env).stdout)["decode"]
    assert before["source"] == "bound"
    bench = run_cli("bench", str(smollm2_path), "--repetitions", "1", "--json", env=env, timeout=300)
    assert bench.returncode == 0, bench.stderr
    tg = json.loads(bench.stdout)["tg_tokens_per_s"]
    done = run_cli("fit", str(smollm2_path), env=env)
    line = next(x for x in done.stdout.decode().splitlines() if x.startswith("decode: "))
    shown = re.match(r"decode: ~(\d+) tok/s \(measured by runner bench on this machine, (\S+)\)$", line)
    assert shown, line
    assert abs(float(shown[1]) - tg) <= 0.3 * tg, (line, tg)
    report = json.loads(run_cli("fit", str(smollm2_path), "--json", env=env).stdout)["decode"]
    assert report["source"] == "measured" and report["tokens_per_s"] == round(tg, 1)
    assert report["measured_at"].startswith(shown[2])


@pytest.mark.model
def test_fit_without_a_measurement_says_its_bound_is_one_and_what_bench_measured_nearby(
    smollm2_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model bench has not measured here: the bandwidth bound, said to be an upper bound, beside
    what bench measured here of the model nearest in size against its own bound (for scale only)."""
    import io

    import synth

    from runner.commands.fit import Request, fit_model
    from runner.loader import machine, speed_where
    from runner.memory import speed

    monkeypatch.setenv("RUNNER_HOME", str(tmp_path / "home"))
    here = machine()
    header = read_header(smollm2_path)
    plan = make_plan(header, here, Ask(ctx=768))
    per_token = speed.bytes_per_token(header, plan)
    speed.remember(
        speed_where(smollm2_path, plan, here),
        speed.Measured("smollm2", 40.0, 160.0, per_token, "2026-12-06T10:00:00+00:00"),
    )
    other = synth.write_model(tmp_path / "gemma.gguf", synth.SPECS["gemma3"])
    report, text = io.StringIO(), io.StringIO()
    fit_model(Request(str(other), as_json=True), out=report)
    fit_model(Request(str(other)), out=text)
    decode = json.loads(report.getvalue())["decode"]
    assert decode["source"] == "bound" and decode["measured_at"] is None
    assert decode["nearest_measured"] == {"model": "smollm2", "tokens_per_s": 40.0, "of_bound": 0.25}
    line = next(x for x in text.getvalue().splitlines() if x.startswith("decode: "))
    assert re.fullmatch(
        r"decode: ~\d+ tok/s at most \(an upper bound: bytes read per token / memory bandwidth; runner "
        r"bench measured smollm2 here at 0\.25 of its bound \(40 tok/s\), but that share differs from "
        r"model to model; runner bench MODEL measures it, and fit shows that figure after\)",
        line,
    ), line
    # the measured model itself: its own figure
    own = io.StringIO()
    fit_model(Request(str(smollm2_path), as_json=True), out=own)
    assert json.loads(own.getvalue())["decode"]["source"] == "measured"


@pytest.mark.fast
def test_a_ctx_past_what_llama_cpp_counts_is_refused_naming_the_bound() -> None:
    """--ctx 2147483647 padded to 256 is 2**31, past llama.cpp's 32-bit positions: refused at once with
    the bound and where the model's own context is said, never planned at a context nobody asked for."""
    from runner.limits import MAX_CTX, MAX_INT32
    from runner.memory.plan import check_asked

    assert MAX_CTX == 2_147_483_392 and -(-MAX_CTX // 256) * 256 <= MAX_INT32
    check_asked(ctx=MAX_CTX, gpu_layers=None)
    with pytest.raises(InvalidSetting) as refused:
        check_asked(ctx=MAX_INT32, gpu_layers=None)
    said = str(refused.value)
    assert said.startswith("--ctx must be at most 2,147,483,392, the largest context llama.cpp counts")
    assert "(got 2,147,483,647)" in said and "trained on" in said and "2,147,483,648" not in said
