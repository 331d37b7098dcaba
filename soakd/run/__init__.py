"""The run session: ``soakd run`` and ``soakd sweep`` (see :mod:`soakd.run.session`)."""
