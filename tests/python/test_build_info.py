"""What the installed package says about itself: one version everywhere, the `stoker` command
that pip installs, and what the search for the CUDA runtime found (docs/install.md)."""

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import sysconfig

import pytest

import stoker

# The `stoker` command that `pip install` put next to this interpreter.
STOKER_COMMAND = shutil.which("stoker", path=sysconfig.get_path("scripts"))


def run_python(code, env):
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={**os.environ, **env}, timeout=120)
    assert result.returncode == 0, result.stderr
    return result


def test_one_version_for_the_package_the_library_and_the_command():
    assert stoker.__version__ == importlib.metadata.version("stoker")
    assert stoker.build_info()["version"] == stoker.__version__
    assert STOKER_COMMAND, "pip install did not put the stoker command in the environment"
    out = subprocess.run([STOKER_COMMAND, "--version"], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == f"stoker {stoker.__version__}"


def test_build_info_agrees_with_cuda_available():
    cuda = stoker.build_info()["cuda"]
    assert set(cuda) == {"library", "runtime_version", "driver_version", "devices", "why",
                         "searched"}
    assert stoker.cuda_available() == (cuda["devices"] > 0)
    assert (cuda["why"] is None) == stoker.cuda_available()
    if cuda["library"] is None:
        assert cuda["runtime_version"] == 0 and "no CUDA runtime" in cuda["why"]
    assert cuda["searched"], "the search went nowhere"


def test_the_pytorch_wheels_runtime_is_searched_before_the_system():
    torch = pytest.importorskip("torch")
    torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    searched = stoker.build_info()["cuda"]["searched"]
    assert torch_lib in searched
    assert searched.index(torch_lib) < searched.index("the system library path")


def test_no_runtime_found_falls_back_to_the_cpu_and_says_why(tmp_path):
    # STOKER_CUDA_RUNTIME names the one place to look: an empty directory finds nothing.
    code = """
import json, numpy as np, stoker
loader = stoker.DataLoader(stoker.ArrayDataset(np.arange(10, dtype=np.float32)), batch_size=5,
                           device="cuda")
devices = [str(b[0].device) if hasattr(b[0], "device") else "numpy" for b in loader]
print(json.dumps({"info": stoker.build_info(), "available": stoker.cuda_available(),
                  "device": loader.stats()["device"], "devices": devices}))
"""
    result = run_python(code, {"STOKER_CUDA_RUNTIME": str(tmp_path)})
    out = json.loads(result.stdout)
    cuda = out["info"]["cuda"]
    assert cuda["library"] is None and cuda["devices"] == 0 and not out["available"]
    assert cuda["searched"] == [str(tmp_path)]
    assert cuda["why"] == f"no CUDA runtime (libcudart) found in {tmp_path}"
    assert out["device"] == "cpu" and set(out["devices"]) <= {"cpu", "numpy"}
    # The engine's one log line (stderr by default) gives the reason.
    fallbacks = [line for line in result.stderr.splitlines() if "no CUDA device answers" in line]
    assert len(fallbacks) == 1 and cuda["why"] in fallbacks[0], result.stderr

    info = subprocess.run([STOKER_COMMAND, "info"], capture_output=True, text=True, check=True,
                          env={**os.environ, "STOKER_CUDA_RUNTIME": str(tmp_path)}).stdout
    assert "cuda runtime: none found" in info and cuda["why"] in info


@pytest.mark.skipif(not os.path.isdir("/usr/local/cuda/lib64"), reason="no CUDA toolkit here")
def test_a_runtime_without_a_device_is_found_and_says_why():
    code = "import json, stoker; print(json.dumps(stoker.build_info()['cuda']))"
    cuda = json.loads(run_python(code, {"STOKER_CUDA_RUNTIME": "/usr/local/cuda/lib64"}).stdout)
    assert cuda["library"].startswith("/usr/local/cuda/lib64/libcudart.so")
    assert cuda["runtime_version"] >= 11000
    if cuda["devices"]:
        pytest.skip("a CUDA device answered")
    assert cuda["why"]
