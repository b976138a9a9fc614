"""The GPU check command (``python -m snnjax.bench.gpu``) runs on the CPU at tiny sizes, so it cannot rot."""
import json

from snnjax.bench import gpu


def read(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_gpu_checks_dry_run_on_the_cpu(tmp_path):
    assert gpu.main(["--tiny", "--out-dir", str(tmp_path)]) == 0
    summary = read(tmp_path / "gpu_check_cpu.jsonl")
    assert [r["run"] for r in summary] == ["pallas", "neuron LIF float32", "neuron PLIF float16",
                                           "train cifar10dvs_vgg float32", "train cifar10dvs_vgg bfloat16"]
    assert all(r["status"] == "ok" and r["device_kind"] for r in summary)
    kernels = read(tmp_path / "pallas_check_cpu.jsonl")
    # three hand-written kernel cases, three kernels generated from a step (a user's LIF, two catalogue neurons)
    assert len(kernels) == 6 and all(r["ok"] for r in kernels)
    assert [r["case"][:2] for r in kernels[3:]] == [["step", "UserLIF"], ["step", "EIFNode"],
                                                   ["step", "HalfThresholdIFNode"]]
    neurons = read(tmp_path / "neuron_cpu.jsonl")
    assert {(r["neuron"], r["dtype"], r["impl"]) for r in neurons} == {
        ("LIF", "float32", "xla"), ("LIF", "float32", "pallas"), ("LIF", "float32", "user:pallas"),
        ("PLIF", "float16", "xla"), ("PLIF", "float16", "pallas")}
    for n in ("LIF", "PLIF"):  # the interpreted kernels and the XLA path give the same spikes and gradient
        first, *others = (r for r in neurons if r["neuron"] == n and r["T"] == 4)
        for other in others:
            assert first["spikes"] == other["spikes"] > 0
            assert abs(first["dx_norm"] - other["dx_norm"]) <= 1e-2 * first["dx_norm"]
    assert all("dw" in r for r in neurons if r["neuron"] == "PLIF")
    steps = read(tmp_path / "train_step_cpu.jsonl")
    assert [r["dtype"] for r in steps] == ["float32", "bfloat16"]
    assert all(r["peak_bytes"] > r["temp_bytes"] > 0 and r["median_ms"] > 0 for r in steps)
    # without SpikingJelly (as in CI) each comparison is recorded as unavailable, with the reason
    assert all("spikingjelly_ms" in r or r["spikingjelly_error"] for r in steps)


def test_device_tags_name_the_chip():
    assert gpu.device_tag("NVIDIA H100 80GB HBM3", "gpu") == "h100"
    assert gpu.device_tag("NVIDIA H200", "gpu") == "h200"
    assert gpu.device_tag("cpu", "cpu") == "cpu"
