"""The one line shown for an engine that failed to start: its root cause."""

from __future__ import annotations

from router.lab.engine_log import error_line

# Shaped like a vLLM 0.32 start that fails in its engine core: the core's traceback, then the
# API server's, whose last line only points back at the first.
TWO_TRACEBACKS = """\
(APIServer pid=101) INFO 11-25 15:00:01 [api_server.py:1] vLLM API server version 0.32.0
(EngineCore_DP0 pid=202) ERROR 11-25 15:00:09 [core.py:700] EngineCore failed to start.
(EngineCore_DP0 pid=202) Traceback (most recent call last):
(EngineCore_DP0 pid=202)   File "core.py", line 690, in run_engine_core
(EngineCore_DP0 pid=202) ValueError: To serve at least one request with max seq len (9000),\
 18 GiB KV cache is needed
(APIServer pid=101) Traceback (most recent call last):
(APIServer pid=101)   File "api_server.py", line 10, in <module>
(APIServer pid=101) RuntimeError: Engine core initialization failed. See root cause above.\
 Failed core proc(s): {}
"""


def test_the_root_cause_is_chosen_over_the_pointer_to_it() -> None:
    assert error_line(TWO_TRACEBACKS).startswith("ValueError: To serve at least one request")


def test_a_dotted_exception_name_counts() -> None:
    log = "Traceback (most recent call last):\nhuggingface_hub.errors.HFValidationError: bad id\n"
    assert error_line(log) == "huggingface_hub.errors.HFValidationError: bad id"


def test_without_an_exception_the_last_line_is_shown() -> None:
    assert error_line("loading\nKilled\n\n") == "Killed"
    assert error_line("") == "(the engine printed nothing)"


def test_only_a_pointer_is_still_shown() -> None:
    log = "RuntimeError: Engine core initialization failed. See root cause above.\n"
    assert error_line(log) == log.strip()
