"""Config: defaults work with no file, flags override, and every bad value names its key and exits 2."""

from __future__ import annotations

import re
import subprocess
import typing
from pathlib import Path

import pytest

from soakd.config import Config, ConfigError, config_keys, load_config, parse_duration
from tests.conftest import soakd_cmd


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "soak.toml"
    p.write_text(text)
    return p


def test_defaults_need_no_file() -> None:
    """With no file and no flags, the builtin convnet soaks in closed loop on the auto device."""
    cfg = load_config()
    assert cfg.model.spec == "builtin:convnet"
    assert cfg.model.device == "auto"
    assert cfg.load.concurrency == 8 and cfg.load.rate is None
    assert cfg.metrics.addr == "127.0.0.1:9464"
    assert cfg.model.warmup == 50


def test_flags_override_file(tmp_path: Path) -> None:
    """A flag wins over the file, and choosing --rate replaces the file's concurrency."""
    p = write(tmp_path, "[load]\nconcurrency = 4\nduration = '10m'\n[batcher]\nmax_batch_size = 16\n")
    cfg = load_config(p, {"load.rate": "250", "batcher.max_batch_size": "4"})
    assert cfg.load.rate == 250.0 and cfg.load.concurrency is None
    assert cfg.load.duration == 600.0
    assert cfg.batcher.max_batch_size == 4


@pytest.mark.parametrize(
    ("text", "overrides", "needle"),
    [
        ("[lod]\nconcurrency = 2\n", {}, "lod: unknown section"),
        ("[load]\nconcurency = 2\n", {}, "load.concurency: unknown key"),
        ("[load]\nconcurrency = 'many'\n", {}, "load.concurrency: expected an integer"),
        ("[load]\nconcurrency = 0\n", {}, "load.concurrency: must be >= 1"),
        ("[load]\nrate = -5\n", {}, "load.rate: must be > 0"),
        ("[load]\nduration = 'soon'\n", {}, "load.duration: cannot parse duration"),
        ("[load]\narrival = 'bursty'\n", {}, "load.arrival: expected constant, poisson or gamma"),
        ("[load]\nrate = 10\nconcurrency = 2\n", {}, "choose one"),
        ("[model]\nspec = 'torchscript:/no/such/model.pt'\n", {}, "/no/such/model.pt: model file not found"),
        ("[model]\nspec = 'builtin:resnet9000'\n", {}, "unknown builtin model 'resnet9000'"),
        ("[model]\nspec = 'onnx:x.onnx'\n", {}, "model.spec: cannot parse"),
        ("[model]\ndevice = 'tpu'\n", {}, "model.device: expected auto, cpu or cuda"),
        ("[batcher]\nmax_batch_size = 0\n", {}, "batcher.max_batch_size: must be >= 1"),
        ("[batcher]\ninstances = 0\n", {}, "batcher.instances: must be >= 1"),
        ("[metrics]\naddr = 'localhost'\n", {}, "metrics.addr: expected HOST:PORT"),
        ("[input]\nshapes = '3by224'\n", {}, "input.shapes: cannot parse"),
        ("load = 3\n", {}, "load: expected a table"),
        ("load = 3\n", {"load.rate": "5"}, "load: expected a table, got 3"),  # a flag into a non-table
        ("[load\n", {}, "not valid TOML"),
        ("", {"load.concurrency": "0"}, "load.concurrency: must be >= 1"),
        ("", {"load.duration": "1x"}, "load.duration: cannot parse duration '1x'"),
    ],
)
def test_bad_values_name_the_key(tmp_path: Path, text: str, overrides: dict[str, str], needle: str) -> None:
    """Each invalid input raises one ConfigError whose message names the key path or file."""
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text), overrides)
    assert needle in str(info.value)


def test_missing_config_file_names_it(tmp_path: Path) -> None:
    """A config path that does not exist is named in the error."""
    with pytest.raises(ConfigError, match=r"nope\.toml: config file not found"):
        load_config(tmp_path / "nope.toml")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("1h30m", 5400), ("250ms", 0.25), ("2d", 172800), (12, 12), ("1.5m", 90), ("1h 5m", 3900)],
)
def test_durations(text: str | int, seconds: float) -> None:
    """Durations take the units people write."""
    assert parse_duration(text) == pytest.approx(seconds)


def test_check_config_cli_exit_codes(tmp_path: Path) -> None:
    """`soakd check-config` prints ok and exits 0 for a good file, names the key and exits 2 for a bad one."""
    good = write(tmp_path, "[load]\nrate = 100\narrival = 'gamma'\nburstiness = 4\n")
    ok = subprocess.run(soakd_cmd("check-config", str(good)), capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "ok" in ok.stdout
    bad = tmp_path / "bad.toml"
    bad.write_text("[batcher]\nmax_queue_delay_ms = 'slow'\n")
    res = subprocess.run(soakd_cmd("check-config", str(bad)), capture_output=True, text=True)
    assert res.returncode == 2
    assert "batcher.max_queue_delay_ms: expected a number" in res.stderr


def test_run_with_bad_flag_exits_2() -> None:
    """A bad flag value stops `soakd run` before anything loads, with exit 2."""
    res = subprocess.run(soakd_cmd("run", "--concurrency", "0"), capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert "load.concurrency: must be >= 1" in res.stderr
    res = subprocess.run(soakd_cmd("run", "--model", "torchscript:missing.pt"), capture_output=True, text=True)
    assert res.returncode == 2
    assert "missing.pt: model file not found" in res.stderr


def test_an_unknown_key_names_the_closest_known_one(tmp_path: Path) -> None:
    """A misspelled key or section gets 'did you mean' and the list of known ones."""
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, "[load]\nconcurency = 2\n"))
    assert "load.concurency: unknown key (did you mean concurrency?" in str(info.value)
    assert "max_inflight" in str(info.value)
    with pytest.raises(ConfigError, match=r"^lod: unknown section \(did you mean load\?"):
        load_config(write(tmp_path, "[lod]\nconcurrency = 2\n"))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        # the broken bound, the key's unit and why the bound holds
        ({"load.rate": "2e6"}, "load.rate: must be <= 1e+06 requests/s (one arrival per microsecond"),
        ({"load.rate": "0"}, "load.rate: must be > 0 requests/s, got 0"),  # the why is the upper bound's
        ({"memory.interval": "50ms"}, "memory.interval: must be >= 0.1s (one round of every memory collector"),
        ({"leak.alpha": "0.5"}, "leak.alpha: must be < 0.5, got 0.5"),
        ({"target.watch_pid": ["7", "0"]}, "target.watch_pid[1]: must be >= 1, got '0'"),
        ({"target.watch_pid": ["x"]}, "target.watch_pid[0]: expected an integer, got 'x'"),
        ({"model.dtype": "int8"}, "model.dtype: expected float32, float16 or bfloat16, got 'int8'"),
        ({"slo.max_error_ratio": "never"}, "slo.max_error_ratio: expected none or a number, got 'never'"),
        ({"slo.stage_p99_ms": {"e2e": "fast"}}, "slo.stage_p99_ms: expected a number, got 'fast'"),
        ({"input.pad": "maybe"}, "input.pad: expected true or false, got 'maybe'"),
        ({"load.rate": "inf"}, "load.rate: must be a finite number, got 'inf'"),
        ({"slo.p99_ms": "nan"}, "slo.p99_ms: must be a finite number, got 'nan'"),
        ({"leak.min_slope_bytes_per_hour": {"host_rss": float("inf")}}, "leak.min_slope_bytes_per_hour.host_rss: must"),
        ({"model.warmup": str(2**64)}, f"model.warmup: {2**64} is outside the 64-bit integer range"),
        ({"memory.interval": "0"}, "memory.interval: duration must be > 0, got '0'"),
        ({"phases.ramp": "-1s"}, "phases.ramp: cannot parse duration '-1s'"),
    ],
)
def test_errors_say_key_bound_unit_and_value(overrides: dict[str, object], message: str) -> None:
    """msgspec's '... - at `$.load.rate`' reads as one line: the key path, what is wrong (with the
    unit and the reason the bound holds) and the value as given."""
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    assert str(info.value).startswith(message), str(info.value)


def test_flags_and_toml_take_the_same_values(tmp_path: Path) -> None:
    """A flag's text converts to the key's type (msgspec's lax mode); an integer is text where a
    key takes both (output_tokens), and "none" switches the error gate off."""
    cfg = load_config(None, {"input.pad": "true", "target.watch_pid": ["12"], "slo.max_error_ratio": "0.5"})
    assert cfg.input.pad is True and cfg.target.watch_pid == [12] and cfg.slo.max_error_ratio == 0.5
    p = write(tmp_path, "[target]\noutput_tokens = 128\n[slo]\nmax_error_ratio = 'none'\n")
    cfg = load_config(p)
    assert cfg.target.output_tokens == "128" and cfg.slo.max_error_ratio == "none"
    assert load_config(None, {"model.options": {"depth": float("inf")}}).model.options == {"depth": float("inf")}


def test_the_bounds_help_states_are_the_bounds_enforced() -> None:
    """For every key with bounds: a value just past each one is refused, naming the key; the bound
    itself (when inclusive) is accepted as far as that key goes."""
    checked = 0
    for section, keys in config_keys().items():
        hints = typing.get_type_hints(type(getattr(Config(), section)))
        for name, key in keys.items():
            meta = key.meta
            if meta is None or isinstance(key.default, (list, dict)):
                continue
            whole = re.search(r"\bint\b", str(hints[name])) is not None
            for bound, inclusive, step in (
                (meta.ge, True, -1),
                (meta.gt, False, -1),
                (meta.le, True, 1),
                (meta.lt, False, 1),
            ):
                if bound is None:
                    continue
                past = bound + step * (1 if whole or bound == 0 else abs(bound) * 0.5)
                with pytest.raises(ConfigError, match=rf"^{re.escape(key.path)}: .*must be"):
                    load_config(None, {key.path: str(int(past) if whole else past)})
                checked += 1
                if inclusive:
                    try:
                        load_config(None, {key.path: str(int(bound) if whole else bound)})
                    except ConfigError as exc:
                        assert not str(exc).startswith(f"{key.path}: must be"), exc
    assert checked >= 30


@pytest.mark.parametrize(
    ("text", "size"), [("8GiB", 8 << 30), ("512 MiB", 512 << 20), ("1024", 1024), ("1.5KiB", 1536)]
)
def test_sizes_parse_in_binary_units(text: str, size: int) -> None:
    from soakd.config.parse import parse_size

    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["8GB", "8 gib", "GiB", "-1GiB", "0", "1.2.3MiB", "inf"])
def test_a_size_that_is_none_is_refused_by_name(text: str) -> None:
    from soakd.config.parse import parse_size

    with pytest.raises(ValueError, match="size"):
        parse_size(text)
