import pytest
import torch

from sipit.models import load_model

torch.set_num_threads(1)


@pytest.fixture(scope="session", params=["tiny-gpt2", "tiny-llama"])
def tiny_lm(request):
    return load_model(request.param)


@pytest.fixture(scope="session")
def smollm2():
    return load_model("smollm2")



@pytest.fixture(scope="session")
def capture():
    """capture(path, model, layer, lines): `sipit capture --file` of the text lines into path."""
    from sipit.cli import main

    def capture(path, model, layer, lines):
        text = path.with_suffix(".txt")
        text.write_text("\n".join(lines) + "\n")
        assert main(["--threads", "1", "capture", "--model", model, "--layer", str(layer), "--file", str(text),
                     "-o", str(path)]) == 0
        text.unlink()

    return capture
