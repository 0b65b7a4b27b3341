"""The guides' command blocks run as written: a fenced block after a line
`<!-- guide-test: NAME -->` in docs/*.md is one step of the walkthrough NAME, and
a block after `<!-- guide-test: NAME file=PATH -->` is a file the walkthrough
reads (written into its work directory first). Each walkthrough runs in bash, its
blocks in order, in a fresh work directory with the environment `make` built on
the PATH (as `source .venv/bin/activate` gives it), the checkout's programs
importable, and the guides' port 8500 replaced by a free one; a command that
ends in `&` (a server) is waited for on its port and stopped at the end. The
programs run in the foreground (`python -m PROGRAM ...`) run inside the test's
process, each as its command line says (`tests.programs.run_script`): the
walkthrough's cost is its work, not a TensorFlow start-up per command. It
passes when every command exits 0 and nothing says that a schedule is too short
to train a model."""

import os
import re
import sys

import pytest

from dare_tf.testing.ports import free_port
from dare_tf.testing.redis_cluster import BUS_OFFSET
from tests.conftest import REPO, USER_ENV
from tests.programs import run_script

DOCS = os.path.join(REPO, "docs")
MARK = re.compile(r"^<!-- guide-test: (?P<name>[\w-]+)(?: file=(?P<file>\S+))? -->$")
# The guides' ports: the model servers' (gRPC) and the one-machine Redis Cluster's (each node's
# bus port 10,000 above it), replaced by free ones.
GUIDE_PORTS = ("8500", "8510", "7000", "7001", "7002", "7003", "7004", "7005")


def walkthroughs() -> dict[str, dict]:
    """`{name: {"doc": file, "commands": [block, ...], "files": {path: text}}}` in the docs' order."""
    found: dict[str, dict] = {}
    for doc in sorted(f for f in os.listdir(DOCS) if f.endswith(".md")):
        lines = open(os.path.join(DOCS, doc)).read().splitlines()
        for i, line in enumerate(lines):
            mark = MARK.match(line.strip())
            if not mark:
                continue
            if not lines[i + 1].startswith("```"):
                raise AssertionError(f"docs/{doc}:{i + 1}: a guide-test mark not followed by a fenced block")
            end = next(j for j in range(i + 2, len(lines)) if lines[j].startswith("```"))
            block = "\n".join(lines[i + 2:end]) + "\n"
            walk = found.setdefault(mark["name"], {"doc": doc, "commands": [], "files": {}})
            if mark["file"]:
                walk["files"][mark["file"]] = block
            else:
                walk["commands"].append(block)
    return found


def script(walk: dict, ports: dict[str, int]) -> str:
    """The walkthrough's commands as one bash script, the guides' ports replaced by
    `ports` (servers waited for on their port, then stopped)."""
    def wait(port: int) -> str:  # (for the server just started, $!: one that exited is said at once)
        return (f'"{sys.executable}" -c "import os, socket, time, sys\n'
                'for _ in range(600):\n'
                '    try: os.kill(int(sys.argv[1]), 0)\n'
                f'    except OSError: sys.exit(\'the server for port {port} exited before it answered\')\n'
                '    try:\n'
                f'        socket.create_connection((\'127.0.0.1\', {port}), 1).close(); sys.exit(0)\n'
                '    except OSError: time.sleep(0.1)\n'
                f'sys.exit(\'port {port} did not answer in 60 s\')" $!')

    # (at the end the servers get SIGTERM, then SIGKILL: a Redis replica ignores SIGTERM while it writes
    # its first append-only file)
    out = ["set -euo pipefail",
           "trap 'kill $(jobs -p) 2>/dev/null; sleep 1; kill -9 $(jobs -p) 2>/dev/null || true' EXIT"]
    for block in walk["commands"]:
        text = re.sub(r"(?<!\d)(" + "|".join(ports) + r")(?!\d)", lambda m: str(ports[m.group(1)]), block)
        for command in re.split(r"(?<!\\)\n", text):
            out.append(command)
            if not command.lstrip().startswith("#") and re.search(r"&\s*(#.*)?$", command):
                named = re.search(r"--port[= ](\d+)", command)
                out.append(wait(int(named.group(1)) if named else ports[GUIDE_PORTS[0]]))
    return "\n".join(out) + "\n"


WALKTHROUGHS = walkthroughs()


def test_the_guides_mark_their_walkthroughs():
    assert {"brands", "live-clicks"} <= set(WALKTHROUGHS), sorted(WALKTHROUGHS)
    for name, walk in WALKTHROUGHS.items():
        assert walk["commands"], f"{name}: no command block"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(WALKTHROUGHS))
def test_a_guides_walkthrough_runs_as_written(name, tmp_path):
    walk = WALKTHROUGHS[name]
    for path, text in walk["files"].items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    env = dict(USER_ENV, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
               PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")
    ports: dict[str, int] = {}
    for guide_port in GUIDE_PORTS:  # (free, and so are their bus ports: redis-server's cluster bus)
        ports[guide_port] = free_port(set(ports.values()), bus_offset=BUS_OFFSET)
    done = run_script(script(walk, ports), cwd=str(tmp_path), env=env, timeout=900)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"docs/{walk['doc']} ({name}):\n{output[-4000:]}"
    assert "too few to train a model" not in output, output[-4000:]
    assert "Traceback" not in output, output[-4000:]
    if name == "brands":  # a brand field carried from the CSV to a recommendation from the history store
        assert re.search(r"^user 1: \d+ clicks in lmdb:histories; the newest: item \d+, category \d+, "
                         r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \(\d+\)$", done.stdout, re.M), done.stdout[-3000:]
        assert re.search(r"^\| 1 \| \d+ \| \d+ \| [01]\.\d+ \| \d+ \| \w+ \|$", done.stdout, re.M), done.stdout[-3000:]
    if name == "live-clicks":  # the appended clicks are read by the next recommendation
        # First-day issue (5): the first line names the newest click, so the live one shows.
        read = re.findall(r"^user U000001: (\d+) clicks in lmdb:histories; the newest: (.*)$", done.stdout, re.M)
        assert len(read) == 2 and int(read[1][0]) == int(read[0][0]) + 3, done.stdout[-3000:]
        # (the loaded history keeps the log's times: issue 58 (4))
        assert re.fullmatch(r"item SKU\d+, category C\d+, 2017-1\d-\d\d \d\d:\d\d:\d\d UTC \(\d+\)", read[0][1]), read
        assert int(read[0][1].rsplit("(", 1)[1][:-1]) < 1512381600 and read[1][1] == (
            "item SKU0000651, category C0007, 2017-12-04 10:02:00 UTC (1512381720)"), read
        # Issue 65 (2): clicks of a category the user never had bring its items among the
        # candidates (the recent-categories source's floor) and move the ranker's top ten.
        counts = re.findall(r"^the 200 candidates: .*; (\d+) of the newest click's category (C\d+)$", done.stdout,
                            re.M)
        assert len(counts) == 4 and counts[1][1] == "C0007" and int(counts[1][0]) > 0, counts
        tables = re.findall(r"^\| (\d+) \| (SKU\d+) \| (C\d+) \|", done.stdout, re.M)
        assert len(tables) == 40 and tables[:10] != tables[10:20] and "C0007" in {c for _, _, c in tables[10:20]}, (
            tables)
        # Issue 69 (6): the one-machine fleet (docs/serving.md, "A fleet"): the histories loaded into a
        # local Redis Cluster, recommend over two model servers, a live click acknowledged by a replica.
        fleet = re.findall(r"^user U000001: (\d+) clicks in redis-cluster://127\.0\.0\.1:\d+; the newest: (.*)$",
                           done.stdout, re.M)
        assert len(fleet) == 2 and int(fleet[0][0]) == int(read[1][0]) - 3 and int(fleet[1][0]) == int(
            fleet[0][0]) + 1, (fleet, read)
        assert fleet[0][1] == read[0][1] and fleet[1][1].startswith("item SKU0000661, category C0007, "), fleet
        assert ("acknowledged: each user's clicks on the master of its slot and on 1 of its replicas (WAIT 1)"
                in done.stdout + done.stderr), done.stdout[-3000:]
