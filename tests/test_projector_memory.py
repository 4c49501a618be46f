"""A vision projector's memory (runner.memory.projector): the estimate against libmtmd's own logged
figures (a child process per projector: scripts/bench_projector_memory.py's probe, SmolLM2 and the
projector loaded as runner loads them), the estimate and the plan counting it on the device libmtmd
puts it, `fit --mmproj` showing it, and a refusal naming its share. A Qwen projector's figures are
for the largest image libmtmd takes (64 x 64 tokens), and its graph's replay for any other size is
checked against the log too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.gguf import check_projector, read_header
from runner.memory.devices import Machine
from runner.memory.estimate import Load, estimate, with_compute
from runner.memory.graph import compute_buffer_size
from runner.memory.kv import CPU_ALIGNMENT
from runner.memory.plan import CPU_MARGIN, Ask, describe_refusal, device_table, make_plan
from runner.memory.projector import (
    COMPUTE_META,
    HOST_FIXED,
    ProjectorMemory,
    estimate_projector,
    vit_graph,
    vit_of,
)
from runner.ui import human_bytes as _human
from tests.conftest import run_cli
from tests.helpers import load_script

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "bench_projector_memory.py"
MiB = 1 << 20
# libmtmd logs MiB with two decimals: a figure under a MiB is checked to that rounding, the rest to 5%
TOLERANCE = 0.05
LOG_ROUNDING_MIB = 0.005


bench = load_script("bench_projector_memory")
NAMES = ("mlp", "gemma3", "idefics3", "qwen2vl", "qwen25vl", "mlp-224", "gemma3-448", "idefics3-512")


@pytest.fixture(scope="module")
def projectors(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> dict[str, Path]:
    """The test projectors and larger synthetic ones (224 px mlp with a class embedding, 4 blocks of
    width 256; 448 px gemma3, 3 f16 blocks of width 512, 64 image tokens; SmolVLM's 512 px idefics3
    tiles, 2 f16 blocks of width 768, 64 tokens a tile) for SmolLM2."""
    out = tmp_path_factory.mktemp("projectors")
    return {name: bench.write(name, smollm2_path, out) for name in NAMES}


def _memory(path: Path) -> ProjectorMemory:
    header = read_header(path)
    return estimate_projector(header, check_projector(header))


def _close(estimated_bytes: int, logged_mib: float) -> bool:
    return abs(estimated_bytes / MiB - logged_mib) <= max(TOLERANCE * logged_mib, LOG_ROUNDING_MIB)


# -- the estimate, with hand-picked numbers -----------------------------------------------------


@pytest.mark.model
def test_the_test_mlp_projectors_weights_and_graph(projectors: dict[str, Path]) -> None:
    header = read_header(projectors["mlp"])
    info = check_projector(header)
    memory = estimate_projector(header, info)
    # f32 throughout: the patch embedding 14x14x3x32 (75,264) and its bias (128), 4 positions (512),
    # pre_ln (256), 2 blocks of q/k/v/out 32x32 (16,384) with biases (512), ln1/ln2 (512), ffn up and
    # down 32x64 (16,384) with biases (384), mm.0 32x32 with its bias (4,224), mm.2 32x576 and bias (76,032)
    assert (
        memory.tensor_bytes
        == 75_264 + 128 + 512 + 256 + 2 * (16_384 + 512 + 512 + 16_384 + 384) + 4_224 + 76_032
    )
    assert memory.weights_cpu == memory.tensor_bytes  # every tensor a multiple of 32 bytes already
    assert (memory.projector_type, memory.image_tokens, memory.image_size) == ("mlp", 4, 28)
    # llava's graph runs block_count - 1 blocks: 54 nodes, as libmtmd logs them; placed as ggml places it
    assert len(vit_graph(vit_of(header, info)).nodes) == 54
    assert memory.compute_cpu == 14_176
    assert memory.work_cpu == 0  # f32 weights: no matmul converts its input


@pytest.mark.model
def test_the_idefics3_graph_shuffles_patches_into_tokens(projectors: dict[str, Path]) -> None:
    """idefics3-512: 32 x 32 patches of width 768, shuffled by 4 into 64 rows of 12,288, times
    mm.model.fc into SmolLM2's 576; ffn_down's f16 input (3,072 x 1,024 patches) is the widest the
    CPU converts, not mm.model.fc's (12,288 x 64)."""
    header = read_header(projectors["idefics3-512"])
    info = check_projector(header)
    graph = vit_graph(vit_of(header, info))
    assert info.image_tokens == 64 and graph.nodes[-1].ne[:2] == (576, 64)
    assert graph.nodes[-2].ne[:2] == (768 * 16, 64)  # the shuffle's last cont
    memory = estimate_projector(header, info)
    assert memory.work_cpu == 3072 * 1024 * 2
    # an image is up to ceil(preproc_image_size / 512)**2 tiles of 64 tokens and the whole image
    tiles = (-(-header.metadata["clip.vision.preproc_image_size"] // 512)) ** 2
    assert (memory.tiles, memory.most_tokens) == (tiles, 64 * (tiles + 1))
    assert memory.per_image() == (
        f"up to {64 * (tiles + 1):,} image tokens an image (up to {tiles} tiles of 512 x 512 px and the "
        "whole image, 64 each)"
    )


@pytest.mark.model
def test_f16_matrices_give_the_cpu_a_work_buffer(projectors: dict[str, Path]) -> None:
    """gemma3-448: f16 matrices, so the CPU converts each matmul's input to f16: the widest is ffn_down's
    2,048-wide input for 1,024 patches (4 MiB)."""
    memory = _memory(projectors["gemma3-448"])
    assert memory.work_cpu == 2_048 * 1_024 * 2
    assert memory.host(on_gpu=False) - memory.host(on_gpu=True) == memory.work_cpu


@pytest.mark.model
def test_estimate_counts_the_projector_where_libmtmd_puts_it(
    projectors: dict[str, Path], smollm2_path: Path
) -> None:
    header = read_header(smollm2_path)
    memory = _memory(projectors["gemma3-448"])
    plain = estimate(header, Load(n_ctx=2048))
    cpu = estimate(header, Load(n_ctx=2048, projector=memory))
    share = memory.weights_cpu + memory.compute_cpu + memory.host(on_gpu=False)
    assert cpu.devices[0].projector_bytes == cpu.projector_bytes == share
    assert cpu.host_rss_bytes - plain.host_rss_bytes == share
    assert cpu.total_bytes - plain.total_bytes == share
    kinds = {(b.kind, b.device): b.nbytes for b in cpu.buffers if b.kind.startswith("mmproj")}
    assert kinds == {("mmproj", "cpu"): memory.weights_cpu, ("mmproj compute", "cpu"): memory.compute_cpu}

    checked = with_compute(cpu, {"CPU": 1 << 20})  # a dry run's compute buffers: the projector's stay
    assert checked.projector_bytes == share and checked.devices[0].projector_bytes == share
    assert [b for b in checked.buffers if b.kind.startswith("mmproj")] == [
        b for b in cpu.buffers if b.kind.startswith("mmproj")
    ]

    gpu = estimate(
        header, Load(n_ctx=2048, n_gpu_layers=-1, gpu=True, projector=memory)
    )  # GPU layers: on the GPU
    on = {d.device: d.projector_bytes for d in gpu.devices}
    assert on == {
        "gpu": memory.weights_gpu + memory.compute_gpu,
        "cpu": memory.inputs_gpu_host + memory.host(on_gpu=True),  # the image's inputs; no work buffer
    }
    no_layers = estimate(header, Load(n_ctx=2048, n_gpu_layers=0, gpu=True, projector=memory))
    assert {d.device: d.projector_bytes for d in no_layers.devices} == {"cpu": share, "gpu": 0}


@pytest.mark.model
def test_plan_refuses_a_projector_that_does_not_fit_naming_its_share(
    projectors: dict[str, Path], smollm2_path: Path
) -> None:
    header = read_header(smollm2_path)
    memory = _memory(projectors["gemma3-448"])
    alone = make_plan(header, Machine(8 << 30, 8 << 30), Ask(ctx=2048))
    budget = alone.verdicts[0].needed_bytes + memory.weights_cpu // 2  # room for the model, not the projector
    machine = Machine(8 << 30, int(budget / (1 - CPU_MARGIN)) + 1)
    assert make_plan(header, machine, Ask(ctx=2048)).fits
    refused = make_plan(header, machine, Ask(ctx=2048, projector=memory))
    assert not refused.fits
    needs, share = _human(refused.verdicts[0].needed_bytes), _human(refused.estimate.projector_bytes)
    assert f"(CPU needs {needs}, {share} of it for the projector, has " in describe_refusal(
        "smollm2", refused
    )
    assert device_table(refused)[0].split()[:8] == [
        "device", "weights", "KV", "cache", "compute", "output", "other", "projector"
    ]  # fmt: skip


@pytest.mark.model
def test_plan_gives_up_context_for_the_projector(projectors: dict[str, Path], smollm2_path: Path) -> None:
    """Room for the projector beside a 2,048-token context, not beside the default 8,192: without --ctx
    the plan keeps the projector and takes less context (or a q8_0 cache) than the model alone gets."""
    header = read_header(smollm2_path)
    memory = _memory(projectors["gemma3-448"])
    needed = (
        make_plan(header, Machine(8 << 30, 8 << 30), Ask(ctx=2048, projector=memory)).verdicts[0].needed_bytes
    )
    machine = Machine(8 << 30, int((needed + (1 << 20)) / (1 - CPU_MARGIN)))
    alone, chosen = make_plan(header, machine), make_plan(header, machine, Ask(projector=memory))
    assert alone.fits and chosen.fits and chosen.estimate.projector_bytes > 0
    assert (chosen.n_ctx, chosen.type_k) != (alone.n_ctx, alone.type_k)
    assert chosen.n_ctx <= alone.n_ctx


@pytest.mark.model
def test_a_qwen_projector_is_counted_for_its_largest_image(projectors: dict[str, Path]) -> None:
    """Qwen2-VL's test projector (patches of 14, width 32, 2 heads, 2 blocks): counted for libmtmd's
    largest image, 4,096 tokens of 28 x 28 px (1792 x 1792: 16,384 patches); 95 nodes, as libmtmd
    logs them. Its compute buffer grows with the image: a quarter of it for a 1024 x 768 photo (37 x
    27 tokens, 1036 x 756 px), 1/256 for the smallest square (112 px, but 8 tokens at least)."""
    header = read_header(projectors["qwen2vl"])
    info = check_projector(header)
    memory, vit = estimate_projector(header, info), vit_of(header, info)
    assert (memory.image_tokens, memory.image_size, vit.image) == (4096, 1792, 1792)
    assert memory.per_image() == "up to 4,096 image tokens an image (sized as it comes, up to 1792 x 1792 px)"
    graph = vit_graph(vit)
    assert len(graph.nodes) == 95 and graph.nodes[-1].ne[:2] == (576, 4096)
    assert memory.compute_cpu == 60_162_048  # libmtmd logs 57.38 MiB
    assert bench.qwen_size(*bench.PHOTO) == (1036, 756)
    photo = compute_buffer_size(vit_graph(vit, image=(1036, 756)), CPU_ALIGNMENT)
    assert memory.compute_cpu / photo == pytest.approx(4.1, abs=0.05)
    assert bench.qwen_size(112, 112) == (112, 112)
    assert compute_buffer_size(vit_graph(vit, image=(112, 112)), CPU_ALIGNMENT) * 256 == memory.compute_cpu
    # the host: the image (f32) kept and copied, 4,096 embeddings of 576, no window mask
    image = 3 * 1792 * 1792 * 4
    assert memory.host_bytes == 2 * image + 4096 * 576 * 4 + COMPUTE_META + HOST_FIXED
    assert memory.work_cpu == 64 * 16_384 * 2  # ffn_down's f16 input; the merger's is as wide, 4x fewer rows


@pytest.mark.model
def test_qwen25vl_windows_put_a_mask_of_every_pair_of_patches_in_the_buffer(
    projectors: dict[str, Path],
) -> None:
    """Qwen2.5-VL's window attention (every block but every n_wa_pattern-th, 2 here) takes a mask of
    16,384 x 16,384 patches at the largest image: 1 GiB of f32 input, cast to f16 for flash attention
    and once more in each windowed block, and 1 GiB more on the host as clip_encode fills it."""
    header = read_header(projectors["qwen25vl"])
    info = check_projector(header)
    memory, vit = estimate_projector(header, info), vit_of(header, info)
    assert (vit.kind, vit.wa_pattern, len(vit_graph(vit).nodes)) == ("qwen25vl", 2, 102)
    mask = 16_384 * 16_384 * 4
    assert memory.compute_cpu == 1_649_442_816  # libmtmd logs 1573.03 MiB: the mask and a cast of it
    assert mask * 3 // 2 < memory.compute_cpu < mask * 3 // 2 + (64 << 20)
    image = 3 * 1792 * 1792 * 4
    assert memory.host_bytes == 2 * image + 4096 * 576 * 4 + COMPUTE_META + HOST_FIXED
    assert memory.inputs_host == mask and memory.inputs_gpu_host > mask  # the inputs: on the CPU with a GPU
    assert memory.host(on_gpu=True) == memory.host_bytes + mask
    # on the CPU alone the host's copy is freed before the graph writes past the inputs: it counts where
    # the two outgrow the buffer (libmtmd's peak RSS: 2,162 MiB; counted: 2,175 MiB with the weights)
    setting = memory.inputs_gpu_host + mask - memory.compute_cpu
    assert memory.host(on_gpu=False) == memory.host_bytes + setting and setting > 500 * MiB


# -- against libmtmd's own figures ----------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_estimate_agrees_with_libmtmds_log(
    name: str, projectors: dict[str, Path], smollm2_path: Path
) -> None:
    """Loaded as runner loads it (CPU, flash attention "auto", warmup off): the compute buffer is
    reserved at the first encode, for the image the plan counts (a Qwen projector's largest), and the
    estimate is libmtmd's figure (to its log's two decimals)."""
    header = read_header(projectors[name])
    info = check_projector(header)
    memory = estimate_projector(header, info)
    logged = bench.measure(smollm2_path, projectors[name], image=bench.largest(name.split("-")[0]))
    assert not logged.compute_at_init  # warmup off: nothing reserved until an image is encoded
    assert _close(memory.tensor_bytes, logged.model_size_mib), (memory.tensor_bytes / MiB, logged)
    assert _close(memory.compute_cpu, logged.compute_mib["CPU"]), (memory.compute_cpu / MiB, logged)
    assert logged.nodes == len(vit_graph(vit_of(header, info)).nodes)


@pytest.mark.parametrize("name", ["qwen2vl", "qwen25vl"])
@pytest.mark.parametrize("flash_attn", [True, False])
def test_qwen_graph_replays_any_image_size(
    name: str, flash_attn: bool, projectors: dict[str, Path], smollm2_path: Path
) -> None:
    """A smaller image than the plan counts, a 1024 x 768 photo (1036 x 756 px as libmtmd resizes it),
    with flash attention and without (softmax(KQ) and the f32 mask: a GPU whose flash attention does
    not take the head size): the replay is libmtmd's figure."""
    header = read_header(projectors[name])
    vit = vit_of(header, check_projector(header))
    graph = vit_graph(vit, flash_attn=flash_attn, image=bench.qwen_size(*bench.PHOTO))
    logged = bench.measure(smollm2_path, projectors[name], flash_attn=flash_attn, image=bench.PHOTO)
    replayed = compute_buffer_size(graph, CPU_ALIGNMENT)
    assert _close(replayed, logged.compute_mib["CPU"]), (replayed / MiB, logged)
    assert logged.nodes == len(graph.nodes)


# -- the commands ---------------------------------------------------------------------------------


def test_fit_mmproj_shows_the_projector(projectors: dict[str, Path], smollm2_path: Path) -> None:
    memory = _memory(projectors["mlp"])
    done = run_cli("fit", str(smollm2_path), "--mmproj", str(projectors["mlp"]), "--json")
    assert done.returncode == 0, done.stderr.decode()
    report = json.loads(done.stdout)
    share = memory.weights_cpu + memory.compute_cpu + memory.host(on_gpu=False)
    assert report["projector"] == {
        "type": "mlp",
        "image_tokens": 4,
        "tiles": 0,
        "most_image_tokens": 4,
        "image_size": 28,
        "tensor_bytes": memory.tensor_bytes,
        "devices": [
            {
                "device": "cpu",
                "weights_bytes": memory.weights_cpu,
                "compute_bytes": memory.compute_cpu,
                "other_bytes": memory.host(on_gpu=False),
            }
        ],
    }
    cpu = report["devices"][0]
    assert cpu["projector_bytes"] == share == report["estimate"]["projector_bytes"]
    parts = ("weights", "kv", "compute", "output", "other", "embedding", "projector")
    assert sum(cpu[f"{p}_bytes"] for p in parts) == cpu["total_bytes"]

    text = run_cli("fit", str(smollm2_path), "--mmproj", str(projectors["mlp"]))
    assert text.returncode == 0, text.stderr.decode()
    out = text.stdout.decode()
    assert (
        "projector"
        in out.splitlines()[next(i for i, x in enumerate(out.splitlines()) if x.startswith("device"))]
    )
    assert (
        "projector: mlp, 4 image tokens an image of 28 x 28 px: on the CPU 224.8 KB of weights, a 14.2 KB "
        "encoder " in out
    )


def test_fit_counts_a_qwen_projectors_largest_image(projectors: dict[str, Path], smollm2_path: Path) -> None:
    """fit --mmproj with Qwen2.5-VL's test projector: the projector's share is its largest image's,
    the 1.5 GiB window mask among it."""
    memory = _memory(projectors["qwen25vl"])
    done = run_cli("fit", str(smollm2_path), "--mmproj", str(projectors["qwen25vl"]), "--json")
    assert done.returncode == 0, done.stderr.decode()
    report = json.loads(done.stdout)
    assert (report["projector"]["image_tokens"], report["projector"]["image_size"]) == (4096, 1792)
    assert report["projector"]["devices"][0]["compute_bytes"] == memory.compute_cpu > 1536 * MiB
    share = memory.weights_cpu + memory.compute_cpu + memory.host(on_gpu=False)
    assert report["devices"][0]["projector_bytes"] == share


def test_run_refuses_a_projector_that_does_not_fit(
    projectors: dict[str, Path], smollm2_path: Path, tmp_path: Path
) -> None:
    """RUNNER_MEMORY with room for the model at --ctx 2048 but not for the projector beside it: fit says
    so, and run --image --mmproj refuses before loading, naming the projector's share."""
    from PIL import Image

    image = tmp_path / "red.png"
    Image.new("RGB", (40, 30), (200, 10, 10)).save(image)
    model, projector = str(smollm2_path), str(projectors["gemma3-448"])
    alone = json.loads(run_cli("fit", model, "--ctx", "2048", "--json").stdout)
    cap = int((alone["needs_bytes"] + (8 << 20)) / (1 - CPU_MARGIN))  # 8 MB to spare; the projector takes ~48
    env = {"RUNNER_MEMORY": str(cap)}
    assert json.loads(run_cli("fit", model, "--ctx", "2048", "--json", env=env).stdout)["fits"]
    fit = json.loads(run_cli("fit", model, "--ctx", "2048", "--mmproj", projector, "--json", env=env).stdout)
    assert not fit["fits"]
    done = run_cli(
        "run", model, "What is it?", "--image", str(image), "--mmproj", projector, "--ctx", "2048", env=env
    )
    err = done.stderr.decode()
    assert done.returncode == 1, err
    share = _human(fit["devices"][0]["projector_bytes"])
    needs = _human(fit["needs_bytes"])
    assert (
        f"does not fit in RAM at a 2,048-token context (CPU needs {needs}, {share} of it for the projector"
        in err
    )
    assert done.stdout == b""
