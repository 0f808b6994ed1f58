"""docs/gpu.md, held to the code: every command on it that a CPU can run runs (the tiny checkpoint standing
in for a real one, `device = "cpu"`), the files it ships (deploy/voxgate-gpu.toml, deploy/Dockerfile.cuda,
deploy/k8s/voxgate-gpu.yaml) parse and agree with each other and with the CLI, and its sizing numbers
are what the engine's own config code gives for the published sizes, so the page cannot drift.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from support.http import free_port, get, wait_healthy

from engine.qwen3.code_predictor import CodePredictor
from engine.qwen3.codec import CodecDecoder
from engine.qwen3.config import real_config
from engine.qwen3.serving.core_stream import CoreConfig
from engine.qwen3.serving.qwen3_engine import tiny_checkpoint
from engine.qwen3.serving.slots import TalkerSlots
from engine.qwen3.talker import Talker
from gateway.cli import build_parser
from gateway.settings import load_settings

ROOT = Path(__file__).resolve().parents[1]
GUIDE = (ROOT / "docs" / "gpu.md").read_text(encoding="utf-8")
FLAT = " ".join(GUIDE.split())  # its prose with line breaks as spaces, for phrases
GPU_TOML = ROOT / "deploy" / "voxgate-gpu.toml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile.cuda"
K8S_GPU = ROOT / "deploy" / "k8s" / "voxgate-gpu.yaml"
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
GiB, MiB, KiB = 2**30, 2**20, 2**10
RESERVE = 3 * GiB  # the guide's working-memory reserve (not measured)
CARDS_GIB = (24, 48, 80, 141)


def blocks(lang: str) -> list[str]:
    """The guide's fenced code blocks in `lang`."""
    return re.findall(rf"```{lang}\n(.*?)```", GUIDE, re.S)


def commands() -> list[str]:
    """The guide's shell commands, one a line (comments dropped)."""
    return [line.strip() for b in blocks("bash") for line in b.splitlines() if line.strip()
            and not line.lstrip().startswith("#")]  # fmt: skip


# ---- sizing: the arithmetic of section 4, from the engine's own config and allocation code ----------------


def sizes(size: str) -> dict[str, int]:
    """Bytes the native talker's engine holds for the published `size` on a GPU: weights as the engine's
    memory() counts them (talker + predictor bf16, codec fp32), one slot's KV at 2048 positions, codec
    state and carry, each made by the allocation code itself on the meta device."""
    cfg, st = real_config(size)
    tc = cfg.talker_config
    with torch.device("meta"):
        talker = Talker(tc).to(torch.bfloat16)
        predictor = CodePredictor(tc.code_predictor_config, tc.hidden_size)
        codec = CodecDecoder(st.decoder_config)
        model = types.SimpleNamespace(cfg=cfg, device=torch.device("meta"), talker=talker,
                                      new_kv_cache=lambda slots, n: talker.model.new_cache(slots, n))  # fmt: skip
        slot = TalkerSlots.allocate(model, 1, 2048).bytes_per_slot()  # type: ignore[arg-type]
        codec_state = codec.new_state(1).nbytes()

    def count(*modules: torch.nn.Module) -> int:
        return sum(t.numel() for m in modules for t in [*m.parameters(), *m.buffers()])

    copied = ("model.layers.", "model.norm.", "model.codec_embedding.", "codec_head.")  # engine/vllm_talker/talker.py
    vllm_copy = sum(v.numel() for k, v in talker.state_dict().items() if k.startswith(copied))
    return {"bf16_params": count(talker, predictor), "fp32_params": count(codec),
            "weights": 2 * count(talker, predictor) + 4 * count(codec), "kv_2048": slot["kv"],
            "kv_position": slot["kv"] // 2048, "codec": codec_state, "carry": slot["carry"],
            "vllm_copy": 2 * vllm_copy}  # fmt: skip


@pytest.fixture(scope="module")
def arithmetic() -> dict[str, dict[str, int]]:
    return {"0.6B": sizes("0b6"), "1.7B": sizes("1b7")}


def slots(memory_gib: int, s: dict[str, int], context: int) -> int:
    kv = s["kv_position"] * context
    return math.floor((memory_gib * GiB - s["weights"] - RESERVE - kv) / (kv + s["codec"] + s["carry"]))


def test_the_kv_cache_per_position_is_twice_layers_heads_and_head_size_in_bf16(
    arithmetic: dict[str, dict[str, int]],
) -> None:
    for size in ("0b6", "1b7"):
        tc = real_config(size)[0].talker_config
        assert (tc.num_hidden_layers, tc.num_key_value_heads, tc.head_dim) == (28, 8, 128)
    assert "2 (K and V) × 28 × 8 × 128 × 2 B = **112 KiB**" in FLAT
    for s in arithmetic.values():
        assert s["kv_position"] == 112 * KiB and s["kv_2048"] == 224 * MiB
    assert "**224 MiB** at 2048 positions" in FLAT and "112 MiB at 1024" in FLAT


def test_the_guides_weights_codec_state_and_frame_rate_are_the_code_s(arithmetic: dict[str, dict[str, int]]) -> None:
    small, large = arithmetic["0.6B"], arithmetic["1.7B"]
    assert small["fp32_params"] == large["fp32_params"]  # one codec for both sizes
    codec_m = round(small["fp32_params"] / 1e6)
    for name, s in arithmetic.items():
        said = f"{name}: {round(s['bf16_params'] / 1e6)} M × 2 B + {codec_m} M × 4 B = **{s['weights'] / GiB:.1f} GiB**"
        assert said in FLAT, said
    assert f"**{small['vllm_copy'] / GiB:.1f} GiB** more for 0.6B" in FLAT
    assert f"**{large['vllm_copy'] / GiB:.1f} GiB** for 1.7B" in FLAT
    assert f"attention window: **{small['codec'] / MiB:.1f} MiB** (fp32)" in FLAT
    assert max(small["carry"], large["carry"]) < 8 * KiB and "under 8 KiB" in FLAT
    _, st = real_config("0b6")
    rate = st.output_sample_rate / st.decode_upsample_rate
    assert f"**One stream needs {rate:g} frames per second**: {st.output_sample_rate} samples/s ÷ " \
           f"{st.decode_upsample_rate} samples per frame" in FLAT
    assert f"the talker's {real_config('0b6')[0].talker_config.num_hidden_layers} layers" in FLAT
    assert f"{st.decoder_config.sliding_window}-frame attention window" in FLAT


def test_the_guides_slots_table_is_the_formula_over_the_code_s_sizes(arithmetic: dict[str, dict[str, int]]) -> None:
    rows = dict(re.findall(r"^\| (\d+) GiB [^|]*\|((?: \d+ \|){4})$", GUIDE, re.M))
    assert sorted(int(m) for m in rows) == list(CARDS_GIB), rows
    for memory in CARDS_GIB:
        said = [int(x) for x in rows[str(memory)].split("|") if x.strip()]
        want = [slots(memory, arithmetic[size], context)
                for size, context in (("0.6B", 2048), ("0.6B", 1024), ("1.7B", 2048), ("1.7B", 1024))]  # fmt: skip
        assert said == want, (memory, said, want)
    per_gib = GiB / (arithmetic["0.6B"]["kv_2048"] + arithmetic["0.6B"]["codec"] + arithmetic["0.6B"]["carry"])
    assert f"each GiB is about {per_gib:.1f} slots" in FLAT


def test_the_max_batch_default_the_guide_states_is_the_engine_s() -> None:
    assert CoreConfig().max_batch == 32 and "defaults to `min(max_streams, 32)`" in FLAT


# ---- the shipped files ------------------------------------------------------------------------------------


def test_the_gpu_config_loads_through_the_gateway_s_settings_as_the_guide_shows_it() -> None:
    settings = load_settings(GPU_TOML, env={})
    (spec,) = settings.model_specs()
    assert spec.path == "/models/Qwen3-TTS-12Hz-0.6B-CustomVoice" and spec.name == "Qwen3-TTS-12Hz-0.6B-CustomVoice"
    assert spec.options["device"] == "cuda"
    core = {k: v for k, v in spec.options.items() if k != "device"}  # `device` is the loader's, the rest the core's
    CoreConfig(**core)
    (shown,) = blocks("toml")
    assert tomllib.loads(shown) == tomllib.loads(GPU_TOML.read_text()), "the guide shows another config"
    # `--model` replaces the file's model and keeps its engine options (the guide's third command)
    other = load_settings(GPU_TOML, env={}, model="/models/Qwen3-TTS-12Hz-1.7B-Base").model_specs()
    assert [(s.name, s.options) for s in other] == [("Qwen3-TTS-12Hz-1.7B-Base", spec.options)]


def dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) per logical line (continuations joined, comments dropped)."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def test_the_cuda_dockerfile_copies_what_exists_installs_an_extra_and_runs_a_command_the_cli_accepts() -> None:
    steps = dockerfile()
    assert steps[0][0] == "FROM" and re.fullmatch(r"nvidia/cuda:[\w.-]+", steps[0][1])
    copies = [shlex.split(args) for op, args in steps if op == "COPY"]
    for *sources, _ in copies:
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: no such file in the repository"
    config_at = next(dest for *src, dest in copies if src == ["deploy/voxgate-gpu.toml"])
    (arg,) = [args for op, args in steps if op == "ARG"]
    name, _, default = arg.partition("=")
    assert name == "EXTRA" and default in EXTRAS
    built = re.findall(r"--build-arg EXTRA=(\w+)", GUIDE)
    assert built and all(extra in EXTRAS for extra in built)
    assert any('".[${EXTRA},fast]"' in args for op, args in steps if op == "RUN"), "the extra, uvloop: not installed"
    torch_pin = next(d for d in EXTRAS["qwen3"] if d.startswith("torch"))
    assert any(torch_pin in args for op, args in steps if op == "RUN"), "the image's torch is not the extra's pin"
    entry = json.loads(next(args for op, args in steps if op == "ENTRYPOINT"))
    cmd = json.loads(next(args for op, args in steps if op == "CMD"))
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert entry[0] in scripts and entry[1:] == ["serve"]
    args = build_parser().parse_args([*entry[1:], *cmd])
    assert args.config == config_at and args.host == "0.0.0.0"


def test_the_gpu_manifest_parses_and_agrees_with_the_image_and_the_cpu_manifest() -> None:
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed: the manifests cannot be parsed here")
    (deployment,) = list(yaml.safe_load_all(K8S_GPU.read_text()))
    assert deployment["kind"] == "Deployment"
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert container["image"] == "voxgate:cuda"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    args = build_parser().parse_args(["serve", *container["args"]])
    steps = dockerfile()
    config_at = next(shlex.split(a)[-1] for op, a in steps if op == "COPY" and "voxgate-gpu.toml" in a)
    assert args.config == config_at
    model = load_settings(GPU_TOML, env={}).model_specs()[0].path
    mounts = [m["mountPath"] for m in container["volumeMounts"]]
    assert any(model.startswith(m.rstrip("/") + "/") for m in mounts), (model, mounts)
    sleep = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert spec["terminationGracePeriodSeconds"] > sleep + args.drain_grace
    cpu_docs = list(yaml.safe_load_all((ROOT / "deploy" / "k8s" / "voxgate.yaml").read_text()))
    secret = next(d for d in cpu_docs if d["kind"] == "Secret")
    service = next(d for d in cpu_docs if d["kind"] == "Service")
    assert container["envFrom"] == [{"secretRef": {"name": secret["metadata"]["name"]}}]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items(), "the Service would not reach the GPU pods"


# ---- the commands, run as far as a CPU allows ---------------------------------------------------------------


def test_the_guides_commands_are_the_ones_checked_here() -> None:
    """A command added to the page must be run (or knowingly skipped) here."""
    checked = {
        "python3 -m venv .venv && .venv/bin/pip install -e '.[qwen3]'": "extras",
        '.venv/bin/python -c "import torch; print(torch.__version__, torch.cuda.is_available())"': "torch",
        ".venv/bin/voxgate serve --config deploy/voxgate-gpu.toml": "serve",
        ".venv/bin/voxgate serve --config deploy/voxgate-gpu.toml --talker vllm": "vllm",
        ".venv/bin/voxgate serve --config deploy/voxgate-gpu.toml --model /models/Qwen3-TTS-12Hz-1.7B-Base": "config",
        "curl -s http://127.0.0.1:8000/health": "serve",
        "BUDGET=1800 bash bench/gpu_check.sh": "bash -n",
        "docker build -f deploy/Dockerfile.cuda -t voxgate:cuda .": "dockerfile",
        "docker build -f deploy/Dockerfile.cuda --build-arg EXTRA=vllm -t voxgate:cuda-vllm .": "dockerfile",
        'docker run --gpus all -p 8000:8000 -v /models:/models:ro -e VOXGATE_API_KEYS="acme=<sha256hex>" '
        "voxgate:cuda": "dockerfile",
        # the user's own downloads: never run by code or tests (no network, no weights fetched here)
        ".venv/bin/pip install -U huggingface_hub": "download",
        ".venv/bin/hf download Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice --local-dir "
        "/models/Qwen3-TTS-12Hz-0.6B-CustomVoice": "download",
        ".venv/bin/pip install -U modelscope": "download",
        ".venv/bin/modelscope download --model Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice --local_dir "
        "/models/Qwen3-TTS-12Hz-0.6B-CustomVoice": "download",
    }  # fmt: skip
    assert sorted(commands()) == sorted(checked)
    for extra in re.findall(r"-e '\.\[(\w+)\]'", GUIDE):
        assert extra in EXTRAS, extra
    for hub_id in re.findall(r"`Qwen/(Qwen3-TTS-12Hz-[\w.-]+)`", GUIDE):
        from gateway.aliases import QWEN3_MODELS

        assert hub_id in QWEN3_MODELS, hub_id


def test_the_torch_check_prints_the_extras_pin(capsys: pytest.CaptureFixture[str]) -> None:
    (line,) = [c for c in commands() if "import torch" in c]
    exec(shlex.split(line)[-1], {})  # its `-c` program, in this interpreter (torch is imported already)
    version, available = capsys.readouterr().out.split()
    pin = next(d for d in EXTRAS["qwen3"] if d.startswith("torch==")).removeprefix("torch==")
    assert version.split("+")[0] == pin and available in ("True", "False")


def test_the_acceptance_script_and_its_phases_are_what_the_guide_says() -> None:
    script = ROOT / "bench" / "gpu_check.sh"
    subprocess.run(["bash", "-n", str(script)], check=True, timeout=30)
    text = script.read_text()
    phases = re.findall(r'phase "([^"(]+?)(?: \(|")', text)
    for name in ("install", "native talker on CUDA: CUDA graphs + conformance", "vLLM tier on CUDA",
                 "random-weight checkpoints 0.6B and 1.7B", "summary"):  # fmt: skip
        assert name in phases and f"`{name}`" in FLAT, name
    assert "BUDGET=${BUDGET:-470}" in text and "(default 470" in FLAT
    assert "serve --config deploy/voxgate-gpu.toml" in text, "the load phase must serve the shipped GPU config"
    assert "nvidia-smi --query-gpu=name,memory.total,driver_version" in text




@pytest.fixture(scope="module")
def cpu_config(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, dict[str, str]]]:
    """deploy/voxgate-gpu.toml with the tiny checkpoint for the real one and the CPU for the GPU, nothing
    else changed; and the environment the commands run in (this checkout first on the path)."""
    tmp = tmp_path_factory.mktemp("gpu_guide")
    checkpoint = tiny_checkpoint()  # the suite's shared one ($VOXGATE_CACHE): built once, by whichever test is first
    text = GPU_TOML.read_text()
    swapped = text.replace('"/models/Qwen3-TTS-12Hz-0.6B-CustomVoice"', json.dumps(str(checkpoint)))
    swapped = swapped.replace('device = "cuda"', 'device = "cpu"')
    assert swapped.count(str(checkpoint)) == 1 and 'device = "cpu"' in swapped
    config = tmp / "voxgate-gpu-cpu.toml"
    config.write_text(swapped)
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    yield config, checkpoint, env


def _voxgate(line: str, config: Path) -> list[str]:
    """A guide command line as run here: this interpreter's `voxgate`, the CPU stand-in config."""
    words = shlex.split(line)
    assert words[0] == ".venv/bin/voxgate", line
    return [sys.executable, "-m", "gateway.cli", *[str(config) if w == "deploy/voxgate-gpu.toml" else w
                                                   for w in words[1:]]]  # fmt: skip


def test_the_guides_serve_command_serves_the_tiny_checkpoint_on_cpu(
    cpu_config: tuple[Path, Path, dict[str, str]],
) -> None:
    config, checkpoint, env = cpu_config
    port = free_port()
    cmd = [*_voxgate(".venv/bin/voxgate serve --config deploy/voxgate-gpu.toml", config), "--port", str(port)]
    server = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        status, body = wait_healthy(server, port, within_s=90)
        assert status == 200, f"not healthy (exit {server.poll()})"
        assert json.loads(body)["models"] == {checkpoint.name: "ready"}  # a checkpoint's name: its directory's
        if shutil.which("curl"):  # the guide's health check, as written (its port swapped)
            curl = subprocess.run(["curl", "-s", f"http://127.0.0.1:{port}/health"], capture_output=True, text=True,
                                  timeout=10, check=True)  # fmt: skip
            assert json.loads(curl.stdout)["status"] == "ok"
        speech = json.dumps({"model": "tts-1", "voice": "default", "input": "Hello there.", "response_format": "wav"})
        status, audio = get(f"http://127.0.0.1:{port}/v1/audio/speech", data=speech.encode(), timeout=60)
        assert status == 200 and audio[:4] == b"RIFF", (status, audio[:300])
    finally:
        server.terminate()
        try:
            server.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.communicate(timeout=10)


def test_the_guides_vllm_command_without_vllm_exits_with_one_line(
    cpu_config: tuple[Path, Path, dict[str, str]],
) -> None:
    """Without vLLM (the dev venv: `.venv-vllm` holds the vLLM tier) it is refused before anything loads;
    with it, on a CPU, the tiny talker's head size is (vLLM's CPU attention has no kernel for it)."""
    config, _, env = cpu_config
    cmd = [*_voxgate(".venv/bin/voxgate serve --config deploy/voxgate-gpu.toml --talker vllm", config),
           "--port", str(free_port())]  # fmt: skip
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run.stderr[-2000:]
    assert len(run.stderr.strip().splitlines()) == 1 and "vllm" in run.stderr.lower(), run.stderr


def test_the_guides_key_digest_command_prints_a_digest() -> None:
    assert "`.venv/bin/voxgate key-digest KEY`" in FLAT
    run = subprocess.run([sys.executable, "-m", "gateway.cli", "key-digest", "KEY"], capture_output=True, text=True,
                         timeout=60, check=True, env=os.environ | {"PYTHONPATH": str(ROOT)})  # fmt: skip
    assert re.search(r"\b[0-9a-f]{64}\b", run.stdout) and not run.stderr, (run.stdout, run.stderr)


def test_the_guide_is_linked_where_users_look() -> None:
    for page in ("README.md", "docs/deploy.md"):
        assert "docs/gpu.md" in (ROOT / page).read_text() or "gpu.md" in (ROOT / page).read_text(), page


def test_the_guide_names_no_missing_file() -> None:
    for path in set(re.findall(r"`((?:deploy|bench|docs|tests|engine|gateway)/[\w./-]+\.(?:py|md|sh|toml|yaml|cuda))`",
                               GUIDE)):  # fmt: skip
        assert (ROOT / path).exists(), path
    assert (ROOT / "deploy" / "Dockerfile.cuda").exists()
