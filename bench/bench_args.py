"""The bench scripts' command line, one rule for all: each size is an option with its default
(``--sample-kb`` for ``sample_kb``, of its default's type), and ``--smoke`` sets small sizes
that only check that the script runs (its figures mean nothing)."""

from __future__ import annotations

import argparse


def parser(doc: str, **sizes) -> argparse.ArgumentParser:
    """A parser described by the first paragraph of `doc` (the script's docstring), with an
    option for each of `sizes`; a script adds its other options to it."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    for name, default in sizes.items():
        p.add_argument("--" + name.replace("_", "-"), type=type(default), default=default)
    return p


def parse(p: argparse.ArgumentParser, smoke: dict, help: str) -> argparse.Namespace:
    """The arguments given, with `smoke`'s sizes in place of the given ones under --smoke
    (described by `help`)."""
    p.add_argument("--smoke", action="store_true", help=help)
    args = p.parse_args()
    if args.smoke:
        vars(args).update(smoke)
    return args
