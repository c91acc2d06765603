"""Machine peaks measured with torch on this CPU: plausible, bounded in time, and side-effect free."""

from __future__ import annotations

import json

import pytest

from jobprof.ops.calibrate import calibrate

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def cpu_result():
    threads = torch.get_num_threads()
    precision = torch.get_float32_matmul_precision()
    dtype = torch.get_default_dtype()
    result = calibrate(torch)
    # the job's torch settings are exactly as they were
    assert torch.get_num_threads() == threads
    assert torch.get_float32_matmul_precision() == precision
    assert torch.get_default_dtype() == dtype
    return result


def test_cpu_figures_are_positive_and_plausible(cpu_result):
    assert "error" not in cpu_result, cpu_result.get("error")
    assert cpu_result["device"] == "cpu"
    # only float32 on CPU; matmul beating add is likely but not guaranteed, so not asserted
    assert set(cpu_result["matmul_flops_per_s"]) == {"float32"}
    # plausible, not fast: under CI's full load a 2-core VM measured 8.8e7 vector FLOP/s once
    # (idle: ~1e9); a unit error (per ms, per µs) would be off by 1e3 or more
    assert cpu_result["matmul_flops_per_s"]["float32"] > 1e7
    assert cpu_result["vector_flops_per_s"]["float32"] > 1e7
    assert cpu_result["memory_bytes_per_s"] > 1e7
    assert cpu_result["matmul_n"]["float32"] >= 256
    assert cpu_result["memory_buffer_bytes"] >= 64 << 20
    assert "read + write" in cpu_result["memory_bytes_counted"]
    assert cpu_result["threads"] == torch.get_num_threads()


def test_cpu_calibration_is_quick_and_json_ready(cpu_result):
    assert 0 < cpu_result["seconds"] < 2
    assert json.loads(json.dumps(cpu_result)) == cpu_result


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_a_gpu_is_an_error_not_an_exception():
    result = calibrate(torch, device="cuda")
    assert result["device"] == "cuda"
    assert "CUDA is not available" in result["error"]


@pytest.mark.parametrize("device", ["meta", "no-such-device"])
def test_devices_it_cannot_measure_give_an_error(device):
    result = calibrate(torch, device=device)
    assert set(result) == {"device", "error"} and result["error"]


def test_a_broken_torch_gives_an_error():
    result = calibrate(object())
    assert result["device"] == "cpu" and "AttributeError" in result["error"]
