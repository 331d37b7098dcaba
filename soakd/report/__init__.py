"""Reports on a run recorded in a state dir: the data (``data.py``), and the command that formats it."""

from soakd.report.data import RunNotFound, load_run_report

__all__ = ["RunNotFound", "load_run_report"]
