"""The leak lab: trace generators (tuning, held-out, fresh, week), the detector bench and the oracles
(docs/leak-verdicts.md)."""
