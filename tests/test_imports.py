"""gpt/ has no import cycles: every `gpt` import, also those inside functions, forms an acyclic graph,
and each module imports on its own in a fresh interpreter."""
import ast
import subprocess
import sys

import pytest

from conftest import REPO

MODULES = sorted(path.stem for path in (REPO / "gpt").glob("*.py") if path.stem != "__init__")


def gpt_imports(module):
    """The gpt modules `module` imports anywhere in its source."""
    found = set()
    for node in ast.walk(ast.parse((REPO / "gpt" / f"{module}.py").read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "gpt":
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gpt."):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found |= {alias.name.split(".")[1] for alias in node.names if alias.name.startswith("gpt.")}
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


@pytest.mark.parametrize("module", MODULES)
def test_each_module_imports_in_a_fresh_interpreter(module):
    subprocess.run([sys.executable, "-c", f"import gpt.{module}"], cwd=REPO, check=True, capture_output=True)
