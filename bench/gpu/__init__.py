"""soakd's GPU check (issue #18) and its CPU rehearsal (issue #36). The entry points stay at
bench/gpu_check.sh and bench/gpu_rehearse.sh; bench/gpu_wheels.sh fetches what the call carries.

* ``check``: runs the steps, each in its own process under its own timeout, and writes the report.
* ``steps``: the steps themselves (``python -m bench.gpu.steps STEP``).
* ``models``: the models the steps load into ``soakd run`` (planted OOM, fixture recorder).
* ``record``: NVML and allocator answers recorded as the fakes' fixtures.
* ``imports``: the import check run before any step.
* ``image_packages.txt``: the device image's Python packages, which the rehearsal keeps to.
"""
