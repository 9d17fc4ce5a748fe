"""The console tools: each module's main(argv=None) is one command (setup.cfg's console_scripts, or `python -m gpt.commands.X`)."""
from gpt.runtime.host import skip_the_collection_at_exit

skip_the_collection_at_exit()  # each command's process, train_ds.py's ranks included, ends ~1.5 s sooner
