"""The console tools, apart from the library: each module's main(argv=None) is one installed command (setup.cfg's
console_scripts), with its parser and the checks of its flags. They import the library (gpt/*.py); no library
module imports them, except in the `if __name__ == "__main__"` block that keeps `python -m gpt.X` working
(the library's own messages say `python -m gpt.prepare`): it runs the command here.

    prepare.py  gpt-prepare      export.py  gpt-export     plan.py    gpt-plan
    eval.py     gpt-eval         sample.py  gpt-sample     models.py  what gpt-eval and gpt-sample share
    hardware.py python -m gpt.hardware  train.py   train_ds.py's command line (gpt/settings.py's fields)
"""
