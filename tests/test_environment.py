"""Where a measurement ran: the commit of the checkout, the machine and its load, in every bench's JSON."""
import json
import subprocess

from sipit.bench.tap import main as bench_tap
from sipit.environment import commit, environment, finished


def git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def test_commit_is_the_checkouts_and_says_when_tracked_files_changed(tmp_path):
    repo, pkg = tmp_path / "repo", tmp_path / "repo" / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("x = 1\n")
    git(repo, "init", "-q")
    assert commit(pkg) is None  # not tracked yet
    git(repo, "add", "pkg/__init__.py")
    git(repo, "commit", "-q", "-m", "first")
    head = git(repo, "rev-parse", "--short=12", "HEAD")
    assert commit(pkg) == head and len(head) == 12
    (repo / "notes.txt").write_text("x\n")
    assert commit(pkg) == head  # untracked files do not count
    git(repo, "add", "notes.txt")
    git(repo, "commit", "-q", "-m", "notes")
    head = git(repo, "rev-parse", "--short=12", "HEAD")
    (repo / "notes.txt").write_text("y\n")
    assert commit(pkg) == head  # nor tracked files beside the package (docs, results)
    (pkg / "__init__.py").write_text("x = 2\n")
    assert commit(pkg) == head + "+dirty"
    elsewhere = tmp_path / "site-packages" / "pkg"  # a copy git does not track: no commit claimed
    elsewhere.mkdir(parents=True)
    (elsewhere / "__init__.py").write_text("x = 1\n")
    assert commit(elsewhere) is None


def test_environment_at_start_and_end():
    env = environment("sipit bench x")
    assert env["command"] == "sipit bench x" and env["cpus"] >= 1 and len(env["load_average_start"]) == 3
    assert {"commit", "version", "date", "cpu", "torch", "python", "platform"} <= set(env)
    assert "load_average_end" not in env
    assert len(finished(env)["load_average_end"]) == 3 and env["torch_threads"] >= 1


def test_bench_json_says_where_it_ran(capsys):
    bench_tap(["--model", "tiny-llama", "--prefix-len", "4", "--candidates", "4", "--repeats", "1", "--threads", "1"])
    out = json.loads(capsys.readouterr().out)
    env = out["environment"]
    assert env["command"] == "sipit bench tap --model tiny-llama --prefix-len 4 --candidates 4 --repeats 1 --threads 1"
    assert env["torch_threads"] == 1  # the bench's own setting, read when it finished
    assert len(env["load_average_start"]) == len(env["load_average_end"]) == 3
    assert out["ratio_half_over_full"] > 0
