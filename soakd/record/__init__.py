"""The run record: the summary (``soakd-summary.json``) and the report's data, written once and
read back by report, compare, fleet, the SLO gate and sweep."""
