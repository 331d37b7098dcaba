"""Whether a run pushes OTLP, read from config and the standard OTEL_* variables. Apart from
``otlp.py`` so that deciding costs nothing: the OpenTelemetry SDK loads only for runs that push."""

from __future__ import annotations

import os
from collections.abc import Mapping

GENERIC = "OTEL_EXPORTER_OTLP_ENDPOINT"
METRICS = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"
TRACES = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"


def otlp_wanted(enabled: bool | None, environ: Mapping[str, str] = os.environ) -> tuple[bool, bool]:
    """(metrics, traces): config ``otel.enabled`` when set, else on where an endpoint variable is set."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true" or enabled is False:
        return False, False
    if enabled:
        return True, True
    generic = bool(environ.get(GENERIC))
    return generic or bool(environ.get(METRICS)), generic or bool(environ.get(TRACES))
