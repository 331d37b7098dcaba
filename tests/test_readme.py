"""Every shell command README.md and docs/*.md show runs as written, as a new user runs it: from a
copy of the repository root, after `make demo` / `make test` have made `.venv`.

How code blocks are read (the docs follow these rules; `test_blocks_declare_what_they_are` keeps
them to it):

- ```sh blocks (```bash and ```console alike) are run, one command at a time, in the order of
  the page, in one folder per page (a copy of the repository), so a file a block makes is there
  for the blocks after it. A fence with no language must not hold commands.
- ```sh gpu blocks run only where CUDA is available; ```sh template blocks never run (they need
  files, hosts or services the user brings, and say which on a `# template:` line).
- A command runs to its end and must exit 0, or the codes its comment starts with
  (`# exit 0 or 1: the SLO verdict`, `# exits 1: why`; the colon makes it a promise).
- A command that runs until stopped (`soakd run` without `--duration`, unless a `--replay`
  without `--replay-loop` ends it with its trace; `prometheus`) is started
  and waited on until it answers (soakd: `/healthz` says 200 on its `--metrics-addr`, default
  127.0.0.1:9464; Prometheus: `/-/ready`); it keeps running while the rest of its block runs, as
  in a second terminal, then gets SIGINT (Ctrl-C) and must exit 0: at the end of its block, or
  before a later command of the block that needs its port.
- The test substitutes only what keeps the module short: `--duration` longer than 1 s becomes
  `--duration 1s`, `--step-duration` longer than 1 s becomes `--step-duration 1s`; and, where no
  `.venv` exists, `.venv/bin/soakd` and `.venv/bin/python` become this interpreter.
- Not re-run: `make`, `pip` and bootstrap commands (the suite runs after them). `docker compose`
  commands run only where a Docker engine answers (`docker info`), and are taken down after;
  `kubectl` blocks only where a cluster answers (`kubectl cluster-info`).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

from tests.conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# Pages other branches write; a link to one is checked once the page is in the tree.
PAGES_FROM_OTHER_BRANCHES = {"docs/gpu.md", "docs/fleet.md", "docs/architecture.md", "docs/leak-verdicts.md"}
SHELL_LANGS = {"sh", "bash", "shell", "console", "zsh", "shell-session"}  # all run alike
# An unlabelled fence may hold a tree or a diagram, not commands that would escape the test.
LOOKS_LIKE_A_COMMAND = r"^\s*(\$ |\.venv/bin/|soakd |make |curl |python3? |kubectl |docker |systemctl |bash )"
TAGS = {"gpu", "template"}
NOT_RERUN = re.compile(r"^(make|pip3?|\S*/pip|python3? -m venv|scripts/bootstrap\.sh)\b")
NEEDS_TOOL = ("prometheus", "promtool")  # Debian's prometheus package; skipped where absent
MAX_DURATION_S = 1.0
MAX_STEP_S = 1.0
COMMAND_TIMEOUT_S = 300


@dataclass
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    tags: set[str]
    text: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def read_blocks(page: Path) -> list[Block]:
    blocks: list[Block] = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^```(.*)$", lines[i])
        if not m:
            i += 1
            continue
        words = m.group(1).split()
        start, body = i, []
        i += 1
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        lang = words[0] if words else ""
        blocks.append(Block(page, start + 1, lang, set(words[1:]), "\n".join(body)))
        i += 1
    return blocks


def split_commands(text: str) -> list[str]:
    """One entry per command: backslash continuations joined, a heredoc kept with its command, a
    `for ... done` kept whole."""
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        while line.endswith("\\") and i < len(lines):
            line = line[:-1] + lines[i]
            i += 1
        heredoc = re.search(r"<<-?\s*['\"]?(\w+)['\"]?", line)
        if heredoc:
            body = [line]
            while i < len(lines):
                body.append(lines[i])
                i += 1
                if body[-1].strip() == heredoc.group(1):
                    break
            line = "\n".join(body)
        while i < len(lines) and not complete(line):  # a loop or a quote that spans lines
            line += "\n" + lines[i]
            i += 1
        out.append(line)
    return out


def complete(cmd: str) -> bool:
    return subprocess.run(["bash", "-n", "-c", cmd], capture_output=True).returncode == 0


def first_line(cmd: str) -> str:
    return cmd.splitlines()[0]


def comment_of(cmd: str) -> str:
    """The trailing `# ...` of a command's first line (the docs put no ' # ' inside quotes)."""
    _, sep, comment = first_line(cmd).partition(" # ")
    return comment if sep else ""


def expected_codes(cmd: str) -> set[int]:
    m = re.match(r"exits? (\d(?: or \d)*):", comment_of(cmd))  # "# exit 0 or 1: why", "# exits 1: why"
    return {int(d) for d in re.findall(r"\d", m.group(1))} if m else {0}


def words_of(cmd: str) -> list[str]:
    code = first_line(cmd).partition(" # ")[0]
    try:
        return shlex.split(code, comments=True)
    except ValueError:
        return code.split()


def program(cmd: str) -> str:
    """The command's program, past any VAR=value prefixes."""
    for w in words_of(cmd):
        if not re.match(r"^[A-Z_][A-Z0-9_]*=", w):
            return w
    return ""


def is_soakd(cmd: str, sub: str) -> bool:
    w = words_of(cmd)
    return any(x.endswith("soakd") and w[i + 1 : i + 2] == [sub] for i, x in enumerate(w))


def flag(cmd: str, name: str) -> str | None:
    w = words_of(cmd)
    for i, x in enumerate(w):
        if x == name and i + 1 < len(w):
            return w[i + 1]
        if x.startswith(name + "="):
            return x.split("=", 1)[1]
    return None


def seconds(dur: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)", dur)
    return sum(float(n) * units[u] for n, u in parts)


def shorten(cmd: str) -> str:
    def cap(m: re.Match[str], limit: float) -> str:
        return f"{m.group(1)} {limit:g}s" if seconds(m.group(2)) > limit else m.group(0)

    cmd = re.sub(r"(--duration)[ =](\S+)", lambda m: cap(m, MAX_DURATION_S), cmd)
    return re.sub(r"(--step-duration)[ =](\S+)", lambda m: cap(m, MAX_STEP_S), cmd)


def localise(cmd: str, where: Path) -> str:
    """As written where `.venv` exists (CI: `make test` made it); else this interpreter."""
    if (where / ".venv" / "bin" / "soakd").exists():
        return cmd
    py = shlex.quote(sys.executable)
    cmd = re.sub(r"(?<![\w/])\.venv/bin/soakd\b", f"{py} -m soakd", cmd)
    return re.sub(r"(?<![\w/])\.venv/bin/python\b", py, cmd)


def runs_until_stopped(cmd: str) -> bool:
    """A `soakd run` with no `--duration` (a `--replay` without `--replay-loop` ends with its
    trace), or Prometheus."""
    w = words_of(cmd)
    replay_ends = any(x == "--replay" or x.startswith("--replay=") for x in w) and "--replay-loop" not in w
    soak_until_stopped = is_soakd(cmd, "run") and flag(cmd, "--duration") is None and not replay_ends
    return soak_until_stopped or program(cmd) == "prometheus"


def ready_url(cmd: str) -> str:
    if program(cmd) == "prometheus":
        return f"http://{flag(cmd, '--web.listen-address') or '127.0.0.1:9090'}/-/ready"
    return f"http://{flag(cmd, '--metrics-addr') or '127.0.0.1:9464'}/healthz"


def port_of(cmd: str) -> int | None:
    if program(cmd) == "prometheus":
        addr = flag(cmd, "--web.listen-address") or "127.0.0.1:9090"
    elif is_soakd(cmd, "run") or is_soakd(cmd, "sweep"):
        addr = flag(cmd, "--metrics-addr") or "127.0.0.1:9464"
    else:
        return None
    return int(addr.rsplit(":", 1)[1])


def wait_port_free(port: int, timeout: float = 60.0) -> None:
    """A default port may be held for a while by a soakd someone else runs on this host."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) != 0:
                return
        time.sleep(0.5)
    raise AssertionError(f"127.0.0.1:{port} stayed busy for {timeout:.0f} s: another soakd or Prometheus holds it")


@cache
def docker_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0


@cache
def cluster_answers() -> bool:
    if shutil.which("kubectl") is None:
        return False
    return subprocess.run(["kubectl", "cluster-info"], capture_output=True, timeout=30).returncode == 0


@cache
def cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": f"{REPO}{os.pathsep}{path}" if path else str(REPO)}


def bash(cmd: str) -> list[str]:
    return ["bash", "-o", "pipefail", "-c", cmd]


@dataclass
class Background:
    cmd: str
    proc: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


@dataclass
class Page:
    """One folder per page: a copy of the repository, with `.venv` as `make test` left it."""

    root: Path
    compose_files: list[str] = field(default_factory=list)


# Made by `make test` (and bench/gpu_wheels.sh), ignored by git: linked into each page's copy,
# not copied (.venv-servers alone is 1.6 GB: copying it for each of 15 pages was most of this
# module's time, 54 s of a block's 70).
LINKED = (".venv", ".venv-servers", ".venv-locust", ".whl")


def copy_repo(dest: Path) -> Path:
    ignore = shutil.ignore_patterns(
        *LINKED,
        ".git",
        "__pycache__",
        "*.egg-info",
        ".mypy_cache",
        ".ruff_cache",
        ".pytest_cache",
        "soakd-state",
        "state",
        "soakd-summary.json",
        "build",
        "dist",
    )
    shutil.copytree(REPO, dest, ignore=ignore, symlinks=True)
    for name in LINKED:
        if (REPO / name).exists():
            (dest / name).symlink_to(REPO / name, target_is_directory=True)
    return dest


def start(cmd: str, page: Page, where: str) -> Background:
    log = page.root / f".bg-{len(list(page.root.glob('.bg-*')))}.log"
    fh = log.open("wb")
    proc = subprocess.Popen(
        bash(cmd), cwd=page.root, env=env(), stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
    )
    fh.close()
    bg = Background(cmd, proc, log)
    url = ready_url(cmd)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(
                f"{where}: `{first_line(cmd)}` exited {proc.returncode} before it answered:\n{bg.output()}"
            )
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return bg
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.3)
    stop(bg, where)
    raise AssertionError(f"{where}: `{first_line(cmd)}` did not answer {url} within 180 s:\n{bg.output()}")


def stop(bg: Background, where: str) -> None:
    """Ctrl-C, as the user would: SIGINT to the command's process group; it must exit 0."""
    if bg.proc.poll() is None:
        os.killpg(bg.proc.pid, signal.SIGINT)
    try:
        rc = bg.proc.wait(120)
    except subprocess.TimeoutExpired:
        os.killpg(bg.proc.pid, signal.SIGKILL)
        bg.proc.wait()
        raise AssertionError(
            f"{where}: `{first_line(bg.cmd)}` did not stop within 120 s of SIGINT:\n{bg.output()}"
        ) from None
    assert rc == 0, f"{where}: `{first_line(bg.cmd)}` exited {rc} on SIGINT, expected 0:\n{bg.output()}"


def skip_reason(block: Block, cmds: list[str]) -> str | None:
    if "template" in block.tags:
        return "a template: it needs what its `# template:` line names"
    if "gpu" in block.tags and not cuda_available():
        return "a GPU example: needs a CUDA device"
    if cmds and all(NOT_RERUN.match(c) for c in cmds):
        return "make/pip/bootstrap: not re-run, the suite runs after them"
    if any("docker compose" in c for c in cmds) and not docker_answers():
        return "docker compose: no Docker engine answers here (`docker info` fails)"
    if any(re.search(r"\bkubectl ", c) for c in cmds) and not cluster_answers():
        return "kubectl: no Kubernetes cluster answers here (`kubectl cluster-info` fails)"
    missing = sorted({program(c) for c in cmds if program(c) in NEEDS_TOOL and shutil.which(program(c)) is None})
    if missing:
        return f"needs {', '.join(missing)} on PATH (Debian: apt install prometheus)"
    return None


def shell_blocks() -> list[Block]:
    return [b for page in PAGES for b in read_blocks(page) if b.lang in SHELL_LANGS]


@pytest.fixture(scope="module")
def pages() -> Iterator[dict[Path, Page]]:
    made: dict[Path, Page] = {}
    yield made
    for page in made.values():
        for compose in page.compose_files:  # leave no stack running
            subprocess.run(
                ["docker", "compose", *compose.split(), "down", "-v"], cwd=page.root, capture_output=True, timeout=300
            )


@pytest.mark.slow
@pytest.mark.parametrize("block", shell_blocks(), ids=lambda b: b.where)
def test_shown_commands_run(block: Block, pages: dict[Path, Page], tmp_path_factory: pytest.TempPathFactory) -> None:
    """Each command of a shell block exits as its page says, run from the repository root."""
    cmds = split_commands(block.text)
    reason = skip_reason(block, cmds)
    if reason:
        pytest.skip(reason)
    if block.page not in pages:
        pages[block.page] = Page(copy_repo(tmp_path_factory.mktemp(block.page.stem) / "repo"))
    page = pages[block.page]
    running: list[Background] = []
    try:
        for written in cmds:
            if NOT_RERUN.match(written):
                continue
            cmd = localise(shorten(written), page.root)
            if "docker compose" in cmd:
                page.compose_files.append(" ".join(f"-f {f}" for f in re.findall(r"-f (\S+)", cmd)))
            port = port_of(cmd)
            if port is not None:
                for bg in [bg for bg in running if port_of(bg.cmd) == port]:  # Ctrl-C in that terminal first
                    running.remove(bg)
                    stop(bg, block.where)
                wait_port_free(port)
            if runs_until_stopped(cmd):
                running.append(start(cmd, page, block.where))
                continue
            res = subprocess.run(
                bash(cmd), cwd=page.root, env=env(), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S
            )
            want = expected_codes(written)
            assert res.returncode in want, (
                f"{block.where}: `{first_line(written)}` exited {res.returncode}, the docs promise "
                f"{' or '.join(map(str, sorted(want)))}\n"
                f"--- stdout\n{res.stdout[-3000:]}\n--- stderr\n{res.stderr[-3000:]}"
            )
    finally:
        while running:
            stop(running.pop(), block.where)


def test_blocks_declare_what_they_are() -> None:
    """No commands hide in an unlabelled fence, tags are known, templates say what they need."""
    problems = []
    for page in PAGES:
        for b in read_blocks(page):
            if not b.lang and re.search(LOOKS_LIKE_A_COMMAND, b.text, re.M):
                problems.append(f"{b.where}: commands in a fence without a language: make it ```sh so they run")
            if b.tags - TAGS:
                problems.append(f"{b.where}: unknown tag(s) {sorted(b.tags - TAGS)} (known: {sorted(TAGS)})")
            if "template" in b.tags and not re.search(r"^# template: \S", b.text, re.M):
                problems.append(f"{b.where}: a template block needs a `# template: ...` line saying what it needs")
            if "template" not in b.tags and re.search(r"^# template:", b.text, re.M):
                problems.append(f"{b.where}: a `# template:` line in a block not tagged ```sh template")
    assert not problems, "\n".join(problems)


def test_toml_blocks_are_valid_config() -> None:
    """Every TOML fragment the docs show is a config `soakd check-config` accepts."""
    import tempfile

    for page in PAGES:
        for b in read_blocks(page):
            if b.lang != "toml":
                continue
            with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as fh:
                fh.write(b.text + "\n")
            try:
                res = subprocess.run(
                    [sys.executable, "-m", "soakd", "check-config", fh.name],
                    env=env(),
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
            finally:
                os.unlink(fh.name)
            assert res.returncode == 0, f"{b.where}: check-config exited {res.returncode}: {res.stderr.strip()}"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    return {slug(m) for m in re.findall(r"^#+ (.+)$", text, re.M)}


def test_readme_is_a_start_and_links_resolve() -> None:
    """The README stays a short start; every relative link in it and in docs/ reaches a file and heading."""
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 150, f"README.md has {len(readme.splitlines())} lines; keep it to 150"
    broken, pending = [], set()
    for page in PAGES:
        text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            rel = dest.relative_to(REPO).as_posix() if dest.is_relative_to(REPO) else str(dest)
            if not dest.exists():
                (pending.add(rel) if rel in PAGES_FROM_OTHER_BRANCHES else broken.append(f"{page.name}: {target}"))
            elif anchor and anchor not in anchors(dest):
                broken.append(f"{page.name}: {target} (no heading #{anchor} in {rel})")
    assert not broken, "broken links:\n" + "\n".join(broken)
    if pending:
        pytest.skip(f"links to {sorted(pending)} not checked: those pages come from other branches")


def test_blocks_are_read_as_the_rules_say(tmp_path: Path) -> None:
    """Commands split as a shell sees them; expected exit codes, run-until-stopped and shortened
    durations follow the rules in this module's docstring, and the README's first soak is run."""
    page = tmp_path / "page.md"
    page.write_text(
        "```sh\n"
        "cat > a.toml <<'EOF'\n[load]\nrate = 20\nEOF\n"
        ".venv/bin/soakd run --config a.toml --duration 10m \\\n"
        "  --summary-json s.json   # exit 0 or 1: the SLO verdict\n"
        "# a comment line\n"
        ".venv/bin/soakd run --model builtin:noop --metrics-addr 127.0.0.1:9470   # until Ctrl-C\n"
        ".venv/bin/soakd sweep --step-duration 20s --max-batch-size 1,8\n"
        "for f in a b; do\n  echo $f\ndone\n"
        "```\n\n"
        "```sh template\n# template: needs your model\n.venv/bin/soakd run --model torchscript:x.pt\n```\n"
    )
    sh, template = read_blocks(page)
    assert (sh.tags, template.tags, sh.line, template.line) == (set(), {"template"}, 1, 16)
    heredoc, gated, until_stopped, sweep, loop = split_commands(sh.text)
    assert heredoc == "cat > a.toml <<'EOF'\n[load]\nrate = 20\nEOF" and loop == "for f in a b; do\n  echo $f\ndone"
    assert gated.startswith(".venv/bin/soakd run --config a.toml --duration 10m   --summary-json s.json")
    assert (expected_codes(gated), expected_codes(until_stopped), expected_codes(sweep)) == ({0, 1}, {0}, {0})
    assert "--duration 1s" in shorten(gated) and "--step-duration 1s" in shorten(sweep)
    assert shorten(".venv/bin/soakd run --duration 500ms") == ".venv/bin/soakd run --duration 500ms"
    assert runs_until_stopped(until_stopped) and not runs_until_stopped(gated)
    assert not runs_until_stopped(".venv/bin/soakd run --replay t.jsonl")  # ends with its trace
    assert runs_until_stopped(".venv/bin/soakd run --replay t.jsonl --replay-loop")
    assert ready_url(until_stopped) == "http://127.0.0.1:9470/healthz"
    assert port_of(gated) == 9464 and port_of(heredoc) is None
    assert localise(gated, tmp_path).startswith(f"{shlex.quote(sys.executable)} -m soakd run")
    assert (skip_reason(template, split_commands(template.text)) or "").startswith("a template")
    first = [b for b in read_blocks(REPO / "README.md") if b.lang == "sh" and "first-soak.toml" in b.text]
    assert first and skip_reason(first[0], split_commands(first[0].text)) is None, "the README's first soak must run"
