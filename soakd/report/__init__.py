"""Reports on runs recorded in state dirs: pure documents (``data.py``, ``document.py``, renderers,
``compare.py``, ``fleet.py``) and the commands that read their inputs (``command.py``, ``inputs.py``)."""

from soakd.report.data import RunNotFound, load_run_report

__all__ = ["RunNotFound", "load_run_report"]
