"""``gpurouter lab ENGINE up|down|status|build``: real inference engines on this machine.

``up`` builds (once) the engine's own environment and the tiny models, starts the engines each
pinned to a core, waits until they are ready and writes a fleet file to serve them with;
``down`` stops exactly what ``up`` started; ``status`` says what runs where. Exit codes: 0 done
(``status``: every engine ready), 1 it failed (``status``: no lab, or an engine not ready),
2 bad arguments.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

from router.lab.cpu_dtype import DTYPES, host_dtype
from router.lab.engine_kind import ServeOptions
from router.lab.engines import DEFAULT_READY_S
from router.lab.kinds import KINDS
from router.lab.lab import DEFAULT_MODEL, DEFAULT_SIZES
from router.lab.models import SIZES

if TYPE_CHECKING:
    from router.lab import Engine, EngineKind, LabEnvironment

_DEFAULTS = ServeOptions()


def add_arguments(p: argparse.ArgumentParser) -> None:
    engines = p.add_subparsers(dest="engine", required=True, metavar="ENGINE")
    for name in KINDS:
        engine = engines.add_parser(name, help=f"real {name} engines on this machine's CPU")
        actions = engine.add_subparsers(dest="action", required=True, metavar="ACTION")
        _add_up(actions.add_parser("up", help="start engines and write their fleet file"))
        actions.add_parser("down", help="stop exactly the engines `up` started")
        actions.add_parser("status", help="which engines run, on which ports and cores")
        build = actions.add_parser("build", help="build the environment and models only")
        build.add_argument("--rebuild", action="store_true", help="build it again from scratch")


def _add_up(up: argparse.ArgumentParser) -> None:
    up.add_argument("--engines", type=_positive, default=2, help="how many engines (2)")
    up.add_argument(
        "--sizes",
        type=_sizes,
        default=DEFAULT_SIZES,
        help=f"model sizes the engines take in turn ({','.join(DEFAULT_SIZES)}; "
        f"known: {', '.join(SIZES)})",
    )
    up.add_argument("--cores", type=_cores, help="a core per engine, e.g. 0,1 (default: 0, 1...)")
    up.add_argument("--model-name", default=DEFAULT_MODEL, help=f"served name ({DEFAULT_MODEL})")
    up.add_argument(
        "--max-num-seqs",
        type=_positive,
        default=_DEFAULTS.max_num_seqs,
        help=f"each engine's concurrency, the fleet's batch size ({_DEFAULTS.max_num_seqs})",
    )
    up.add_argument(
        "--kv-cache-gib",
        type=_positive,
        default=_DEFAULTS.kv_cache_gib,
        help=f"each engine's KV cache in whole GiB ({_DEFAULTS.kv_cache_gib})",
    )
    up.add_argument(
        "--dtype",
        choices=("auto", *DTYPES),
        default="auto",
        help="the number format the engines compute in (auto: bfloat16 where this CPU has "
        "bf16 instructions, float32 elsewhere, the faster there)",
    )
    up.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_READY_S,
        help=f"seconds to wait for the engines to be ready ({DEFAULT_READY_S:g})",
    )


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return value


def _sizes(text: str) -> tuple[str, ...]:
    sizes = tuple(s.strip() for s in text.split(",") if s.strip())
    unknown = [s for s in sizes if s not in SIZES]
    if not sizes or unknown:
        raise argparse.ArgumentTypeError(f"sizes are among {', '.join(SIZES)}, got {text!r}")
    return sizes


def _cores(text: str) -> tuple[int, ...]:
    try:
        cores = tuple(int(c) for c in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"cores are numbers like 0,1, got {text!r}") from None
    if any(c < 0 for c in cores):
        raise argparse.ArgumentTypeError(f"cores are >= 0, got {text!r}")
    return cores


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    # Imported here: the lab's process and HTTP code is not needed to build the parser.
    from router.lab import LabError, engine_kind

    kind = engine_kind(args.engine)
    try:
        if args.action == "up":
            return _up(kind, args, out)
        if args.action == "down":
            return _down(kind, out)
        if args.action == "status":
            return _status(kind, out)
        return _build(kind, args.rebuild, out)
    except LabError as exc:
        err.write(f"gpurouter lab {kind.name} {args.action}: {exc}\n")
        return 1


def _printer(out: TextIO) -> Callable[[str], None]:
    def say(line: str) -> None:
        out.write(f"{line}\n")
        out.flush()

    return say


def _build(kind: EngineKind, rebuild: bool, out: TextIO) -> int:
    from router.lab import ensure_environment, find_environment, lab_home, make_model, model_size

    home = lab_home()
    say = _printer(out)
    reused = not rebuild and find_environment(home, kind) is not None
    environment = ensure_environment(kind, home, rebuild=rebuild, say=say)
    say(_environment_line(environment, reused))
    for size in SIZES:
        say(f"model {size}: {make_model(model_size(size), home / 'models', environment.python)}")
    return 0


def _up(kind: EngineKind, args: argparse.Namespace, out: TextIO) -> int:
    from router.lab import Lab, ensure_environment, find_environment, lab_home

    home = lab_home()
    say = _printer(out)
    reused = find_environment(home, kind) is not None
    environment = ensure_environment(kind, home, say=say)
    say(_environment_line(environment, reused))
    options = ServeOptions(
        max_model_len=_DEFAULTS.max_model_len,
        max_num_seqs=args.max_num_seqs,
        kv_cache_gib=args.kv_cache_gib,
        dtype=host_dtype() if args.dtype == "auto" else args.dtype,
    )
    say(f"engines compute in {options.dtype}{_dtype_reason(args.dtype, options.dtype)}")
    started = time.monotonic()
    lab = Lab.up(
        kind,
        home,
        count=args.engines,
        sizes=args.sizes,
        cores=args.cores,
        served_model=args.model_name,
        options=options,
        timeout_s=args.timeout,
        say=say,
    )
    say(f"{len(lab.engines)} engine(s) ready in {time.monotonic() - started:.0f} s:")
    for engine in lab.engines:
        say(f"  {_engine_line(engine)}")
    say(f"fleet file: {lab.fleet_file}")
    say(f"serve it:   gpurouter serve --config {lab.fleet_file}")
    say(f"stop them:  gpurouter lab {kind.name} down")
    return 0


def _dtype_reason(asked: str, dtype: str) -> str:
    if asked != "auto":
        return " (--dtype)"
    if dtype == "bfloat16":
        return " (this CPU has bf16 instructions)"
    return " (this CPU has no bf16 instructions, and float32 runs faster on it)"


def _down(kind: EngineKind, out: TextIO) -> int:
    from router.lab import Lab, lab_home

    lab = Lab.attach(kind, lab_home())
    if lab is None:
        out.write(f"no {kind.name} lab is up\n")
        return 0
    stopped = lab.down()
    names = ", ".join(engine.name for engine in stopped) or "none was still running"
    out.write(f"stopped {len(stopped)} {kind.name} engine(s): {names}\n")
    return 0


def _status(kind: EngineKind, out: TextIO) -> int:
    from router.lab import Lab, lab_home

    lab = Lab.attach(kind, lab_home())
    if lab is None:
        out.write(f"no {kind.name} lab is up (start one: gpurouter lab {kind.name} up)\n")
        return 1
    dtype = lab.state.options.dtype
    out.write(f"{kind.name} lab computing in {dtype}, fleet file {lab.fleet_file}:\n")
    states = [_state(engine) for engine in lab.engines]
    for engine, state in zip(lab.engines, states, strict=True):
        out.write(f"  {_engine_line(engine)}  {state}\n")
    return 0 if all(state == "ready" for state in states) else 1


def _state(engine: Engine) -> str:
    members = engine.members()
    if not members:
        return "stopped"
    if any(p.state == "T" for p in members):
        return "frozen"
    if not engine.running():
        return f"API server gone ({len(members)} process(es) left)"
    return "ready" if engine.healthy() else "not answering"


def _engine_line(engine: Engine) -> str:
    return (
        f"{engine.name}  {engine.url}  core {engine.core}  {engine.model} "
        f"({engine.model_dir.name})  pid {engine.record.pid}"
    )


def _environment_line(environment: LabEnvironment, reused: bool) -> str:
    how = "reused" if reused else "built"
    took = f"{environment.built_s:.0f} s"
    return f"{environment.kind.name} environment {how} (its build took {took}): {environment.root}"
