"""gpt/ has no import cycles: every `gpt` import, also those inside functions, forms an acyclic graph,
and each module imports on its own, with no other gpt module loaded before it. The console tools (gpt/commands/)
import the library (gpt/*.py), never the reverse."""
import ast
import os
import subprocess
import sys

import pytest

from conftest import REPO

LIBRARY = sorted(path.stem for path in (REPO / "gpt").glob("*.py") if path.stem != "__init__")
COMMANDS = sorted(f"commands.{path.stem}" for path in (REPO / "gpt" / "commands").glob("*.py") if path.stem != "__init__")
MODULES = LIBRARY + COMMANDS


def script_block(node):
    """`if __name__ == "__main__":`, which runs only for `python -m gpt.X`, never when the module is imported."""
    return isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'"


def gpt_imports(module):
    """The gpt modules `module` imports anywhere in its source but its script block."""
    found, nodes = set(), [ast.parse((REPO / "gpt" / f"{module.replace('.', '/')}.py").read_text())]
    while nodes:
        node = nodes.pop()
        if script_block(node):
            continue
        nodes.extend(ast.iter_child_nodes(node))
        if isinstance(node, ast.ImportFrom) and (node.module == "gpt" or (node.module or "").startswith("gpt.")):
            package = node.module.removeprefix("gpt").removeprefix(".")  # "", "plan", "commands.models"
            found |= {package} | {f"{package}.{alias.name}".lstrip(".") for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name.removeprefix("gpt.") for alias in node.names if alias.name.startswith("gpt.")}
    return found & set(MODULES)


def test_the_gpt_import_graph_has_no_cycle():
    graph = {module: gpt_imports(module) for module in MODULES}
    state = {}  # module -> "visiting" | "done"

    def visit(module, path):
        if state.get(module) == "visiting":
            pytest.fail("import cycle: " + " -> ".join(path[path.index(module):] + [module]))
        if state.get(module) != "done":
            state[module] = "visiting"
            for imported in sorted(graph[module]):
                visit(imported, path + [module])
            state[module] = "done"
    for module in MODULES:
        visit(module, [])



def test_the_settings_and_the_console_import_nothing_from_the_project():
    """Anything may read a run's settings or report bad input without loading the trainer's dependencies."""
    assert (gpt_imports("settings"), gpt_imports("console")) == (set(), set())


def test_the_planner_does_not_import_the_command_line():
    assert gpt_imports("plan") & {"settings", "preflight", "args", "commands.train", "trainer"} == set()


def test_no_library_module_imports_a_command():
    """gpt/commands/ imports the library, never the reverse; a library module's script block may hand
    `python -m gpt.X` over to its command."""
    assert {module: sorted(gpt_imports(module) & set(COMMANDS)) for module in LIBRARY
            if gpt_imports(module) & set(COMMANDS)} == {}


# One fresh interpreter imports torch and DeepSpeed, then forks a child per gpt module: each child starts with
# no gpt module loaded, as a fresh interpreter would, without paying torch's import (~3 s) again per module.
IMPORT_EACH = """
import os, sys
import torch, deepspeed
failed = []
for module in sys.argv[1:]:
    pid = os.fork()
    if pid == 0:
        try:
            __import__("gpt." + module)
        except BaseException as e:
            print(f"gpt.{module}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            os._exit(1)
        os._exit(0)
    if os.waitpid(pid, 0)[1] != 0:
        failed.append(module)
print(" ".join(failed))
"""


@pytest.mark.slow
def test_each_module_imports_in_a_fresh_interpreter():
    proc = subprocess.run([sys.executable, "-c", IMPORT_EACH, *MODULES], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0 and proc.stdout.split() == [], proc.stderr[-3000:]
