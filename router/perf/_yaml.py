"""Moved to :mod:`router.yaml_lines`; this name stays only until calibration.py imports that.

Delete this file once ``router/perf/calibration.py`` reads
``from router.yaml_lines import FILE_KEY, LineMap, read_yaml``.
"""

from router.yaml_lines import FILE_KEY, LineMap, read_yaml

__all__ = ["FILE_KEY", "LineMap", "read_yaml"]
