"""Names shared by config validation, the metric catalogue and the reports: pipeline stages,
request outcomes and the memory series the leak monitor judges. Imports nothing."""

from __future__ import annotations

STAGES = ("e2e", "queue", "inference", "preprocess", "postprocess")
OUTCOMES = ("ok", "error", "timeout", "oom", "bad_input", "dropped")
LEAK_SERIES = (
    "host_rss",
    "host_uss",
    "malloc_in_use",
    "torch_cuda_allocated",
    "torch_cuda_reserved",
    "gpu_process_memory",
    "gpu_memory_used",
    "target_rss",  # a served model: the first --watch-pid (the server's main process)
    "target_uss",
    "target_gpu_memory",  # NVML's per-process list: that process's sum over GPUs
)
# A scraped server gauge (--scrape URL) is the leak series TARGET_METRIC_PREFIX + its name,
# judged in its own unit: e.g. "target_metric:vllm:num_requests_waiting".
TARGET_METRIC_PREFIX = "target_metric:"
