"""A lab: real engines of one kind on this machine, brought up together, found again from
their run directory, and stopped exactly."""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from router.lab.engine_kind import EngineKind, ServeOptions
from router.lab.engines import DEFAULT_READY_S, Engine, EngineRecord, free_port, wait_ready
from router.lab.environment import LabEnvironment, ensure_environment, find_environment
from router.lab.errors import LabError
from router.lab.fleet_file import write_fleet_file
from router.lab.models import make_model, model_size
from router.lab.state import STATE_FILE, LabState, load_state, save_state

__all__ = ["DEFAULT_MODEL", "DEFAULT_SIZES", "Lab", "run_directory"]

DEFAULT_MODEL = "tiny-llama"
"""The name every engine of a lab serves its model under."""
DEFAULT_SIZES = ("small", "large")
"""Engines take these sizes in turn: a fast one, a slow one, a fast one..."""


def run_directory(home: Path, kind: EngineKind) -> Path:
    """Where ``gpurouter lab KIND up`` keeps its state, logs and fleet file."""
    return home / "run" / kind.name


class Lab:
    """Engines of one kind, their environment and fleet file. ``up`` makes one; ``attach``
    finds the one a run directory holds."""

    def __init__(self, environment: LabEnvironment, state: LabState, run_dir: Path, home: Path):
        self.environment = environment
        self.state = state
        self.run_dir = run_dir
        self.home = home
        self.engines = [Engine(r, environment, state.options) for r in state.engines]

    @property
    def fleet_file(self) -> Path:
        return Path(self.state.fleet_file)

    @property
    def model(self) -> str:
        """The name the lab's first engines serve their model under (the fleet file's)."""
        return self.state.engines[0].served_model

    @classmethod
    def up(
        cls,
        kind: EngineKind,
        home: Path,
        *,
        run_dir: Path | None = None,
        count: int = 2,
        sizes: Sequence[str] = DEFAULT_SIZES,
        cores: Sequence[int] | None = None,
        served_model: str = DEFAULT_MODEL,
        options: ServeOptions | None = None,
        timeout_s: float = DEFAULT_READY_S,
        say: Callable[[str], None] = lambda _: None,
    ) -> Lab:
        """Build what is missing, start ``count`` engines side by side, wait until all are
        ready, write the fleet file. On failure, everything started is stopped again."""
        run_dir = run_dir or run_directory(home, kind)
        if count < 1:
            raise LabError(f"--engines must be at least 1, got {count}")
        _refuse_if_up(kind, home, run_dir)
        environment = ensure_environment(kind, home, say=say)
        plan = list(itertools.islice(itertools.cycle(sizes), count))
        cores = list(cores) if cores else _default_cores(count)
        if len(cores) < count:
            raise LabError(f"{count} engines need {count} cores, got {len(cores)}: {cores}")
        say("making the tiny models")
        models = {s: make_model(model_size(s), home / "models", environment.python) for s in plan}
        ports = _distinct_ports(count)
        records = [
            EngineRecord(
                name=f"{kind.name}-{i}",
                port=ports[i],
                core=cores[i],
                model_dir=str(models[size]),
                served_model=served_model,
                log=str(run_dir / f"{kind.name}-{i}.log"),
            )
            for i, size in enumerate(plan)
        ]
        options = options or ServeOptions()
        state = LabState(kind.name, options, str(run_dir / "fleet.yaml"), records)
        lab = cls(environment, state, run_dir, home)
        lab._start(lab.engines, timeout_s, say)
        write_fleet_file(lab.fleet_file, kind.name, records, served_model, options)
        return lab

    @classmethod
    def attach(cls, kind: EngineKind, home: Path, run_dir: Path | None = None) -> Lab | None:
        """The lab brought up in ``run_dir`` (default: the kind's), or None if there is none."""
        run_dir = run_dir or run_directory(home, kind)
        state = load_state(run_dir)
        if state is None:
            return None
        # Stopping needs no environment; a deleted one must not keep engines from stopping.
        environment = find_environment(home, kind) or LabEnvironment(kind, home / kind.name, 0, "")
        return cls(environment, state, run_dir, home)

    def add_engine(
        self,
        *,
        size: str = "small",
        served_model: str | None = None,
        core: int | None = None,
        options: ServeOptions | None = None,
        timeout_s: float = DEFAULT_READY_S,
    ) -> Engine:
        """Start one more engine (not in the fleet file) and wait until it is ready; ``down``
        stops it with the others. ``options`` default to the lab's."""
        kind = self.environment.kind
        names = {e.name for e in self.engines}
        index = next(i for i in itertools.count() if f"{kind.name}-{i}" not in names)
        taken = {e.record.port for e in self.engines}
        model_dir = make_model(model_size(size), self.home / "models", self.environment.python)
        record = EngineRecord(
            name=f"{kind.name}-{index}",
            port=next(p for p in iter(free_port, None) if p not in taken),
            core=_default_cores(index + 1)[index] if core is None else core,
            model_dir=str(model_dir),
            served_model=served_model or self.model,
            log=str(self.run_dir / f"{kind.name}-{index}.log"),
        )
        engine = Engine(record, self.environment, options or self.state.options)
        self.state.engines.append(record)
        self.engines.append(engine)
        try:
            self._start([engine], timeout_s, lambda _: None)
        except BaseException:
            self.engines.remove(engine)
            self.state.engines.remove(record)
            save_state(self.run_dir, self.state)
            raise
        return engine

    def remove_engine(self, engine: Engine) -> None:
        """Stop ``engine`` and forget it (one that ``add_engine`` started)."""
        engine.stop()
        self.engines.remove(engine)
        self.state.engines.remove(engine.record)
        save_state(self.run_dir, self.state)

    def ensure_ready(self, timeout_s: float = DEFAULT_READY_S) -> None:
        """Every engine running and answering, whatever a test did to it: frozen processes are
        resumed, dead or silent engines restarted."""
        for engine in self.engines:
            engine.thaw()
            if not (engine.running() and engine.healthy()):
                engine.restart(timeout_s)
                save_state(self.run_dir, self.state)

    def down(self) -> list[Engine]:
        """Stop every engine of the lab (only those); the engines that were still running."""
        stopped = [engine for engine in self.engines if engine.stop()]
        with contextlib.suppress(FileNotFoundError):
            (self.run_dir / STATE_FILE).unlink()
        return stopped

    def _start(self, engines: list[Engine], timeout_s: float, say: Callable[[str], None]) -> None:
        for engine in engines:
            engine.log.parent.mkdir(parents=True, exist_ok=True)
            engine.log.write_bytes(b"")
        try:
            for engine in engines:
                engine.start()
                # Recorded at once: an interrupted `up` leaves what `down` needs.
                save_state(self.run_dir, self.state)
            say(f"waiting for {len(engines)} engine(s) to be ready")
            wait_ready(engines, timeout_s)
        except BaseException:
            for engine in engines:
                engine.stop()
            if not any(e.running() for e in self.engines):
                with contextlib.suppress(FileNotFoundError):
                    (self.run_dir / STATE_FILE).unlink()
            raise


def _refuse_if_up(kind: EngineKind, home: Path, run_dir: Path) -> None:
    lab = Lab.attach(kind, home, run_dir)
    if lab is not None and any(engine.members() for engine in lab.engines):
        running = sum(1 for engine in lab.engines if engine.members())
        raise LabError(
            f"a {kind.name} lab is already up ({running} engine(s)); "
            f"stop it first: gpurouter lab {kind.name} down"
        )


def _distinct_ports(count: int) -> list[int]:
    """``count`` free loopback ports, no two alike (the OS may offer one twice in a row)."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


def _default_cores(count: int) -> list[int]:
    """The cores this process may use, in order, taken in turn."""
    available = sorted(os.sched_getaffinity(0))
    return list(itertools.islice(itertools.cycle(available), count))
