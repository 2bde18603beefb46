"""One module per `specbench` command (its parser and handler), and the flags generated from the config
dataclasses (options). bench/cli.py registers them.
"""
