"""The command line's commands, one module each (``python -m rmsnorm_lab COMMAND``);
``rmsnorm_lab/__main__.py`` builds the parser and hands each command its arguments."""
