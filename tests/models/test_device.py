"""Devices: resolution, exact float32 matmuls, batch sizes from free memory, OOM retry (simulated on CPU),
and (cuda marker) the tap and an inversion on a GPU."""
import pytest
import torch

from sipit.models import LayerTap, ModelError, batch_for, exact_matmul, load_model, resolve_device, retry_on_oom
from sipit.models import device as device_mod


def test_resolve_device():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ModelError, match="unknown device"):
        resolve_device("gpu7")
    if not torch.cuda.is_available():
        with pytest.raises(ModelError, match="not available"):
            resolve_device("cuda:0")


def test_oom_halves_the_batch_until_it_fits():
    tried = []

    def run(batch):
        tried.append(batch)
        if batch > 48:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return batch * 10

    assert retry_on_oom(run, 400) == 250
    assert tried == [400, 200, 100, 50, 25]


def test_oom_at_batch_one_is_raised():
    def run(batch):
        raise torch.cuda.OutOfMemoryError("simulated")

    with pytest.raises(torch.cuda.OutOfMemoryError):
        retry_on_oom(run, 8)


def test_other_errors_are_not_retried():
    calls = []

    def run(batch):
        calls.append(batch)
        raise ValueError("a bug, not memory")

    with pytest.raises(ValueError):
        retry_on_oom(run, 8)
    assert calls == [8]


def test_batch_from_free_memory(monkeypatch):
    assert batch_for("cpu", 1000, cap=4096) == 4096  # free memory unknown off CUDA: the cap
    monkeypatch.setattr(device_mod, "free_bytes", lambda dev: 10_000_000)
    assert batch_for("cuda", 1000, cap=100_000) == 5000  # half of the free memory
    assert batch_for("cuda", 1000, cap=100) == 100
    assert batch_for("cuda", 10**9, cap=100, floor=2) == 2


def test_free_memory_counts_the_allocators_unused_blocks(monkeypatch):
    """Blocks PyTorch's caching allocator keeps after a pass are free to the next one."""
    assert device_mod.free_bytes("cpu") is None
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev: (1000, 5000))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda dev: 3000)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda dev: 1200)
    assert device_mod.free_bytes("cuda") == 1000 + 3000 - 1200


def test_memory_left_counts_memory_mapped_weights_as_taken(tmp_path):
    """A model's weights mapped from a file (safetensors) sit in the page cache, which MemAvailable counts as
    free: memory_left subtracts them; tensors in anonymous memory are not counted."""
    path = tmp_path / "w.bin"
    with open(path, "wb") as f:
        f.truncate(1 << 28)  # 256 MiB, sparse: mapped, never read
    mapped = torch.from_file(str(path), shared=True, size=1 << 26)  # float32
    plain = torch.randn(1 << 10)
    assert device_mod.file_backed_bytes([mapped, mapped[10:], plain]) == 1 << 28  # each storage once
    assert device_mod.file_backed_bytes([plain]) == 0
    if device_mod.memory_left("cpu") is not None:  # (Linux)
        assert device_mod.memory_left("cpu", [mapped]) < device_mod.memory_left("cpu") - (1 << 27)


def test_exact_matmul_turns_tf32_off(monkeypatch):
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        exact_matmul("cpu")  # nothing to do off CUDA
        assert torch.backends.cuda.matmul.allow_tf32
        exact_matmul("cuda")
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
        assert torch.get_float32_matmul_precision() == "highest"
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False


@pytest.mark.parametrize("spec", ["tiny-gpt2", "tiny-llama"])
def test_tap_makes_tensors_on_the_model_device(spec):
    """Every tensor the tap creates goes to lm.device. Checked on the meta device, which CPU-only CI
    has: a stray CPU tensor (ids, positions, cache) meeting meta weights raises (a lock-step round on a GPU
    did, where a flat pass joined a search's CPU rows to device rows)."""
    lm = load_model(spec)
    lm.model.to("meta")
    tap = LayerTap(lm, 2)
    prefix = tap.prefill([1, 2, 3])  # ids given as a list, on the CPU
    assert prefix.ids.device.type == "meta" and lm.embedding_rows().device.type == "meta"
    assert tap.extend(prefix, [4, 5]).device.type == "meta"
    states, grown = tap.extend(prefix, torch.tensor([[4, 5], [6, 7]]), keep=True)
    assert states.device.type == "meta" and grown(1, 1).ids.device.type == "meta"
    assert tap.extend_layers(prefix, [4], [1, 2])[1].device.type == "meta"
    # a lock-step round packs rows made on the CPU (a search's candidates) with rows on the device (guesses)
    requests = [(prefix, torch.tensor([[4, 5]])), (prefix, torch.tensor([[6], [7]], device="meta"))]
    for run in (tap._extend_flat, tap._extend_padded):
        (a, _), (b, grown) = run(requests)
        assert a.shape[:2] == (1, 2) and b.shape[:2] == (2, 1) and grown(1, 1).ids.device.type == "meta"


@pytest.mark.cuda
def test_cuda_tap_parity():
    """On a GPU: the tap on CUDA matches the CPU tap (TF32 off) at the first and last layer."""
    ids = torch.tensor([5, 17, 3, 99, 42, 7])
    cpu, gpu = load_model("tiny-llama"), load_model("tiny-llama", device="cuda")
    for layer in (1, -1):
        a = LayerTap(cpu, layer).states(ids)
        b = LayerTap(gpu, layer).states(ids).cpu()
        assert ((a - b).norm() / a.norm()).item() < 1e-5


@pytest.mark.cuda
def test_cuda_inversion_is_exact_with_the_gpu_search_batch():
    """On a GPU: the exhaustive policy (4,096 candidates a pass there) recovers a prompt exactly."""
    from sipit.invert import InvertConfig, invert

    lm = load_model("tiny-llama", device="cuda")
    ids = torch.tensor([[5, 17, 3, 99, 42, 7]])
    r = invert(lm, LayerTap(lm, 2).states(ids), 2, InvertConfig(policy="exhaustive"), progress=False)
    assert r.prompts[0].ids == ids[0].tolist() and r.prompts[0].status == "ok"


@pytest.mark.cuda
def test_cuda_learned_lock_step_is_exact():
    """On a GPU: the learned policy, calibrated there (its screens in the GPU's screening dtype), inverts
    two prompts in lock-step exactly."""
    from sipit.invert import InvertConfig, invert

    lm = load_model("tiny-llama", device="cuda")
    ids = torch.tensor([[5, 17, 3, 99, 42, 7], [250, 17, 203, 99, 242, 7]])
    r = invert(lm, LayerTap(lm, 2).states(ids), 2, InvertConfig(policy="learned"), progress=False)
    assert [p.ids for p in r.prompts] == ids.tolist() and {p.status for p in r.prompts} == {"ok"}


def test_search_rows_fit_free_memory(monkeypatch):
    """On a GPU a pass holds fewer rows on a longer prefix (each row its own copy of the prefix's keys and
    values); off CUDA the cap; an inversion under a tight budget takes more, smaller passes, still exact."""
    from sipit.invert import InvertConfig, invert

    lm = load_model("tiny-llama")
    tap = LayerTap(lm, 2)
    ids = torch.tensor([[250, 17, 203, 99, 242, 7], [3, 240, 9, 251, 60, 199]])  # high ids: reached late
    config = InvertConfig(policy="exhaustive")  # (the two prompts in lock-step)
    free = invert(lm, tap.states(ids), 2, config, progress=False).prompts
    assert tap.rows_that_fit(500, 256) == 256
    monkeypatch.setattr(device_mod, "free_bytes", lambda dev: 400_000)
    short, long = tap.rows_that_fit(6, 4096), tap.rows_that_fit(500, 4096)
    assert 1 <= long < short < 256
    tight = invert(lm, tap.states(ids), 2, config, progress=False).prompts
    assert [p.ids for p in tight] == [p.ids for p in free] == ids.tolist() and {p.status for p in tight} == {"ok"}
    assert tight[0].tap_calls > free[0].tap_calls
