"""The ``lm-rollup`` subcommands other than ``run`` (`rollup.__main__` dispatches): read,
SQL, watch, lifecycle. Argument parsing and printing live here and in `rollup.__main__`;
may import every other `rollup` package.
"""
