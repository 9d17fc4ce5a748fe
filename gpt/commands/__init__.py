"""The console tools: each module's main(argv=None) is one command (setup.cfg's console_scripts, or `python -m gpt.commands.X`)."""
