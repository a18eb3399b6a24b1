"""``python -m minfer.serve``: serve a model over HTTP with the OpenAI API.

    python -m minfer.serve --model smollm2-135m                      # http://127.0.0.1:8000/v1
    python -m minfer.serve --model tiny-random --port 9000 --max-num-seqs 32 --max-waiting 64

Every ``EngineConfig`` field is a flag (``max_num_seqs`` → ``--max-num-seqs``; booleans as ``--cuda-graphs`` /
``--no-cuda-graphs``; values are read as Python literals, so ``--tenant-weights "{'a': 2}"`` and
``--max-model-len None`` work). A server keeps only recent history: ``--finished-window`` and
``--trace-window`` default to 1000 here (the engine's own default keeps everything).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from dataclasses import fields

from minfer.config import SPEED_UPS, EngineConfig, option_value
from minfer.serve.app import MAX_BODY_BYTES

# every speed-up this machine runs (as LLM()), and bounded memory for a long-running server
SERVER_DEFAULTS: dict[str, object] = {**SPEED_UPS, "finished_window": 1000, "trace_window": 1000}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m minfer.serve", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    server = p.add_argument_group("server")
    server.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine "
                        "only; 0.0.0.0 serves the network)")
    server.add_argument("--port", type=int, default=8000)
    server.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                        help="the names clients may ask for (default: --model); answers report the name asked "
                             "for, or the first when a request names none")
    server.add_argument("--max-body-bytes", type=int, default=MAX_BODY_BYTES, help="larger bodies get 413")
    server.add_argument("--retry-after", type=int, default=1, help="seconds a 429 answer asks clients to wait")
    server.add_argument("--shutdown-timeout", type=float, default=5.0,
                        help="on Ctrl+C, seconds in-flight requests may finish before they are aborted")
    server.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    server.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    server.add_argument("--no-access-log", action="store_true", help="do not log every request")
    engine = p.add_argument_group("engine (EngineConfig)")
    for f in fields(EngineConfig):
        flag = "--" + f.name.replace("_", "-")
        own = f.default_factory() if callable(f.default_factory) else f.default
        default = SERVER_DEFAULTS.get(f.name, own)
        if isinstance(default, bool):
            engine.add_argument(flag, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                                help=f"(default {default})")
        else:
            engine.add_argument(flag, type=option_value, default=argparse.SUPPRESS, metavar="VALUE",
                                help=f"(default {default!r})")
    return p


def engine_config(args: argparse.Namespace) -> EngineConfig:
    names = EngineConfig.field_names()
    given = {k: v for k, v in vars(args).items() if k in names}
    return EngineConfig(**{**SERVER_DEFAULTS, **given})


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        config = engine_config(args)
    except (TypeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s: %(name)s: %(message)s")

    from minfer.engine import LLMEngine
    from minfer.serve.server import make_server

    engine = LLMEngine(config)
    server = make_server(engine, args.host, args.port, served_model=args.served_model_name,
                         shutdown_timeout=args.shutdown_timeout, log_level=args.log_level,
                         access_log=not args.no_access_log, max_body_bytes=args.max_body_bytes,
                         retry_after=args.retry_after)
    pool = engine.block_pool
    names = args.served_model_name or [config.model]
    print(f"minfer: serving {', '.join(map(repr, names))} ({config.device}, "
          f"{pool.num_blocks} KV blocks of {pool.block_size} tokens, max_model_len {engine.max_model_len}) "
          f"at http://{args.host}:{args.port}/v1 -- Ctrl+C stops", flush=True)
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn re-raises the Ctrl+C it handled: the shutdown was graceful
        pass
    return 0 if server.started else 1
