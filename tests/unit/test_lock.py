"""The locks: launch/constraints-cpu.txt pins every package setup.cfg asks for (and its test extras) at a version
inside setup.cfg's range, as launch/constraints-gpu.txt does for the CUDA extras; setup_cpu.sh refuses an
unknown mode in one line."""
import configparser
import subprocess

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from common import REPO


def requirements(*sections):
    options = configparser.ConfigParser()
    options.read(REPO / "setup.cfg")
    lines = options["options"]["install_requires"].split("\n") if "install" in sections else []
    for extra in set(sections) - {"install"}:
        lines += options["options.extras_require"][extra].split("\n")
    return [Requirement(line) for line in lines if line.strip()]


def pins(lock):
    lines = (line.strip() for line in (REPO / "launch" / lock).read_text().splitlines())
    return {canonicalize_name(name): version for name, _, version in (line.partition("==") for line in lines
                                                                      if line and not line.startswith("#"))}


@pytest.mark.parametrize("lock, sections", [("constraints-cpu.txt", ("install", "test")),
                                            ("constraints-gpu.txt", ("cuda",))])
def test_the_lock_pins_each_requirement_inside_its_range(lock, sections):
    pinned = pins(lock)
    for requirement in requirements(*sections):
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{lock} does not pin {name}"
        assert requirement.specifier.contains(pinned[name], prereleases=True), (lock, name, pinned[name])


def test_the_cpu_lock_holds_the_torch_that_setup_cpu_installs():
    assert pins("constraints-cpu.txt")["torch"] == "2.13.0"
    assert "torch==2.13.0" in (REPO / "launch" / "setup_cpu.sh").read_text()


def test_setup_cpu_refuses_an_unknown_mode_in_one_line():
    proc = subprocess.run(["bash", "launch/setup_cpu.sh", "--newest"], cwd=REPO, capture_output=True, text=True)
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", "usage: bash launch/setup_cpu.sh [--latest | --freeze]\n")
