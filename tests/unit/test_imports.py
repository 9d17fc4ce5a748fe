"""gpt/ has no import cycles: every `gpt` import, also those inside functions and in `if __name__ == "__main__"`
blocks, forms an acyclic graph. The console tools (gpt/commands/) import the library (the subpackages), never the
reverse. (Each module importing on its own, in a fresh interpreter: tests/integration/test_imports_runs.py.)"""
import ast

import pytest

from common import REPO

GPT = REPO / "gpt"
MODULES = sorted(".".join(path.relative_to(GPT).with_suffix("").parts) for path in GPT.rglob("*.py")
                 if path.stem != "__init__")  # "console", "train.trainer", "commands.plan"
PACKAGES = sorted(path.parent.name for path in GPT.glob("*/__init__.py"))
COMMANDS = [module for module in MODULES if module.startswith("commands.")]
LIBRARY = [module for module in MODULES if module not in COMMANDS]


def script_block(node):
    """`if __name__ == "__main__":`, which runs only for `python -m gpt.X`, never when the module is imported."""
    return isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'"


def gpt_imports(module):
    """The gpt modules `module` imports anywhere in its source, its script block included."""
    found = set()
    for node in ast.walk(ast.parse((GPT / f"{module.replace('.', '/')}.py").read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module == "gpt" or (node.module or "").startswith("gpt.")):
            package = node.module.removeprefix("gpt").removeprefix(".")  # "", "train", "memory.plan"
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
    assert (gpt_imports("config.settings"), gpt_imports("console")) == (set(), set())


def test_the_planner_does_not_import_the_command_line():
    assert gpt_imports("memory.plan") & {"config.settings", "train.start", "train.trainer"} == set()


# docs/architecture.md's order: a package imports only from those before it (and from its own modules)
LAYERS = ["console", "runtime", "model", "data", "config", "memory", "train", "commands"]


def layer(module):
    return LAYERS.index(module.split(".")[0])


def test_no_import_runs_back_up_the_layers():
    up = {(module, imported) for module in MODULES for imported in gpt_imports(module)
          if imported in MODULES and layer(imported) > layer(module)}
    assert up == set()


def test_no_library_module_imports_a_command_or_runs_as_a_script():
    """gpt/commands/ imports the library, never the reverse: `python -m gpt.commands.X` runs a command, and no
    library module has a script block that would import one back."""
    scripts = [module for module in LIBRARY if any(script_block(node) for node in
                                                   ast.parse((GPT / f"{module.replace('.', '/')}.py").read_text()).body)]
    assert {module: sorted(gpt_imports(module) & set(COMMANDS)) for module in LIBRARY
            if gpt_imports(module) & set(COMMANDS)} == {} and scripts == []


def test_every_subpackage_says_what_it_holds_in_one_line():
    docs = {package: ast.get_docstring(ast.parse((GPT / package / "__init__.py").read_text())) for package in PACKAGES}
    assert {package: doc for package, doc in docs.items() if not doc or "\n" in doc} == {}


def test_the_trainer_reads_at_most_twelve_project_modules():
    """Understanding a step means opening the trainer and what it imports: kept to 12 modules (29 before
    the re-layout), the run's start, the model's wrapping and the planner reached through gpt/train/start.py."""
    imported = {module for module in gpt_imports("train.trainer")
                if module not in PACKAGES}  # `from gpt.runtime import ranks`: the module, not its package
    assert len(imported) <= 12, sorted(imported)


def test_setup_cfg_installs_every_subpackage():
    """setup.cfg lists the packages a (non-editable) install copies: a subpackage missing there imports from a clone
    and fails to import once installed."""
    import configparser
    parser = configparser.ConfigParser()
    parser.read(REPO / "setup.cfg")
    listed = {name.strip() for name in parser["options"]["packages"].split(",")}
    assert listed == {"gpt", *(f"gpt.{package}" for package in PACKAGES)}
