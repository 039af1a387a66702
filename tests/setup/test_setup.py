"""scripts/common.sh's set-up steps survive an interruption: a virtual environment left without
pip, or whose making was killed, is made again; a package left half-installed is installed
again; a build directory whose configure was killed or left a cache of another kind is
configured again; and the stage timer of scripts/test.sh.

Run from scripts/test.sh (CI) with the Debian packages of the build installed."""

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def bash(script: str, **kw) -> subprocess.CompletedProcess:
    """`script` after sourcing scripts/common.sh (which moves to the repository's root)."""
    return subprocess.run(["bash", "-c", f'source "{ROOT}/scripts/common.sh"\n{script}'],
                          capture_output=True, text=True, **kw)


def killed_after(script: str, seconds: float) -> None:
    """Starts `script` (as bash()) in its own process group and kills the group after
    `seconds`, as a Ctrl-C or a lost job would, whatever it was doing then."""
    p = subprocess.Popen(["bash", "-c", f'source "{ROOT}/scripts/common.sh"\n{script}'],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    time.sleep(seconds)
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
    p.wait()


def pip_works(venv: pathlib.Path) -> bool:
    return subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "--version"],
                          capture_output=True).returncode == 0


def test_a_venv_with_python_but_no_pip_is_made_again(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    assert (venv / "bin" / "python").exists() and not pip_works(venv)
    out = bash(f'python_venv "{venv}"')
    assert out.returncode == 0, out.stderr
    assert "making it again" in out.stdout
    assert pip_works(venv)
    (venv / "kept").touch()  # and a whole one is kept
    out = bash(f'python_venv "{venv}"')
    assert out.returncode == 0, out.stderr
    assert (venv / "kept").exists() and "making it again" not in out.stdout


def test_a_venv_whose_making_did_not_finish_is_made_again(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    (venv / "left-over").touch()
    (tmp_path / "venv.making").touch()  # as python_venv leaves it when killed
    out = bash(f'python_venv "{venv}"')
    assert out.returncode == 0, out.stderr
    assert not (venv / "left-over").exists() and not (tmp_path / "venv.making").exists()
    assert pip_works(venv)


@pytest.mark.parametrize("seconds", [0.5, 2.0])
def test_a_venv_killed_while_it_was_made_is_whole_after_the_next_run(tmp_path, seconds):
    venv = tmp_path / "venv"
    killed_after(f'python_venv "{venv}"', seconds)
    out = bash(f'python_venv "{venv}"')
    assert out.returncode == 0, out.stderr
    assert pip_works(venv)
    assert not (tmp_path / "venv.making").exists()


def test_a_package_whose_install_was_cut_short_is_installed_again(tmp_path):
    venv = tmp_path / "venv"
    out = bash(f'python_venv "{venv}" braceexpand')
    assert out.returncode == 0, out.stderr
    # What a pip killed midway can leave: the package's metadata (pip counts it installed),
    # not all of its files.
    (package,) = venv.glob("lib/python*/site-packages/braceexpand")
    module = package / "__init__.py"
    module.unlink()
    out = bash(f'python_venv "{venv}" braceexpand\n'
               f'python_imports "{venv}" "from braceexpand import braceexpand" braceexpand')
    assert out.returncode == 0, out.stderr
    assert "installing braceexpand again" in out.stdout
    assert module.exists()


CONFIGURE = "-DCMAKE_BUILD_TYPE=Release -DSTOKER_BUILD_TESTS=OFF -DSTOKER_BUILD_TOOLS=OFF"


def test_a_build_directory_with_an_unfinished_configure_is_configured_afresh(tmp_path):
    build = tmp_path / "build"
    build.mkdir()
    # What a killed configure can leave: a cache, here of another generator, which cmake
    # refuses ("Does not match the generator used previously").
    (build / "CMakeCache.txt").write_text("CMAKE_GENERATOR:INTERNAL=Unix Makefiles\n")
    out = bash(f'configure "{build}" {CONFIGURE}')
    assert out.returncode == 0, out.stderr
    assert "did not finish" in out.stdout
    assert (build / "build.ninja").exists() and not (build / ".configuring").exists()


@pytest.mark.parametrize("seconds", [0.5, 2.0])
def test_a_configure_killed_midway_succeeds_when_run_again(tmp_path, seconds):
    build = tmp_path / "build"
    killed_after(f'configure "{build}" {CONFIGURE}', seconds)
    out = bash(f'configure "{build}" {CONFIGURE}')
    assert out.returncode == 0, out.stderr
    assert (build / "build.ninja").exists() and not (build / ".configuring").exists()


def test_stage_times_lists_each_stage_and_the_total():
    out = bash("trap stage_times EXIT\nstage 'first stage'\nsleep 0.2\nstage 'second stage'\n")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[:2] == ["== first stage", "== second stage"]
    # wall-clock seconds, CPU seconds, the stage
    rows = {line[20:]: (float(line[:8]), float(line[10:18]))
            for line in lines if line[:8].strip()[:1].isdigit()}
    assert set(rows) == {"first stage", "second stage", "in all"}
    times = {name: wall for name, (wall, _) in rows.items()}
    assert times["first stage"] >= 0.2 and times["in all"] >= times["first stage"]
    # sleep takes no CPU; the total counts at least what the stages did
    assert 0 <= rows["first stage"][1] < 0.2 and rows["in all"][1] >= rows["second stage"][1]


def test_stage_times_count_the_cpu_of_the_commands_a_stage_ran():
    busy = "python3 -c 'import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass'"
    out = bash(f"trap stage_times EXIT\nstage busy\n{busy}\nstage idle\nsleep 0.3\n")
    assert out.returncode == 0, out.stderr
    rows = {line[20:]: float(line[10:18]) for line in out.stdout.splitlines()
            if line[:8].strip()[:1].isdigit()}
    assert rows["busy"] >= 0.4 and rows["idle"] < 0.2


def test_stage_times_of_a_failed_run_say_where_it_stopped():
    out = bash("trap stage_times EXIT\nstage 'fine'\nstage 'failing'\nfalse\nstage 'never'\n")
    assert out.returncode == 1
    assert "stopped in the last one, status 1" in out.stdout
    assert "never" not in out.stdout.split("stage times")[1]
    assert out.stdout.rstrip().splitlines()[-2].endswith("failing")
