"""The run record: the summary (``soakd-summary.json``) and the report's data, written once and
read back by report, compare, fleet and the SLO gate. (``soakd sweep`` reads no record: each
step's figures come from its own engine's marks, in run/sweep/results.py.)"""
