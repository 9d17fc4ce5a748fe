"""The console tools: each module's main(argv=None) is one command (setup.cfg's console_scripts, or `python -m gpt.commands.X`)."""
from gpt.console import ctrl_c_in_imports_is_one_line, run_as_a_console_tool

if run_as_a_console_tool():  # first: the tool's module imports torch next (seconds), where a Ctrl-C often lands
    ctrl_c_in_imports_is_one_line()

from gpt.runtime.host import skip_the_collection_at_exit  # noqa: E402

skip_the_collection_at_exit()  # each command's process, train_ds.py's ranks included, ends ~1.5 s sooner
