"""The gateway's flags, apart from gateway.py so `hearth serve --help` does not import the server (and torch).

Declared in serve_args.ServerArgs (the "gateway" group); this adds just those, for a parser of the gateway alone.
"""
from __future__ import annotations

import argparse


def add_gateway_args(p: argparse.ArgumentParser) -> None:
    from hearth.arg_fields import add_args
    from hearth.entrypoints.openai.serve_args import GATEWAY, ServerArgs

    add_args(p, [ServerArgs], groups=[GATEWAY])
