"""scripts/bench/probe_surfaces.py: the probe surfaces load as twin surfaces and keep their mechanisms."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from vllm_ascend_patchset.paths import ROOT
from vllm_ascend_patchset.twin.surface_files import load_surface

_SPEC = importlib.util.spec_from_file_location("probe_surfaces", ROOT / "scripts/bench/probe_surfaces.py")
probe_surfaces = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(probe_surfaces)


def test_every_probe_surface_loads_grows_and_keeps_its_steps(tmp_path, capsys):
    assert probe_surfaces.main(["--out", str(tmp_path)]) == 0
    assert "cpp_surfaces.py --gate --surfaces" in capsys.readouterr().out
    surfaces = {path.stem: load_surface(str(path)) for path in sorted(tmp_path.glob("*.csv"))}
    assert sorted(surfaces) == sorted(probe_surfaces.SURFACES)
    chunks = np.arange(1.0, 8193.0)
    for name, surface in surfaces.items():
        for history in (0.0, 50_000.0):
            assert np.all(np.diff(surface.time_ms_many(chunks, history)) >= -1e-9), name
    # A wave: flat up to its end, a whole wave more one token past it (not a slope in between).
    wave = surfaces["wave24"]
    at = {c: float(wave.time_ms_many(np.array([float(c)]), 0.0)[0]) for c in (2048, 3072, 3073, 4096)}
    assert at[3072] - at[2048] < 10.0 < 100.0 < at[3073] - at[3072] and at[4096] - at[3073] < 10.0
    tiles = surfaces["tiles96"]
    step = tiles.time_ms_many(np.array([97.0]), 0.0)[0] - tiles.time_ms_many(np.array([96.0]), 0.0)[0]
    assert step > 2.0


def test_an_out_that_cannot_be_a_folder_is_refused_naming_it(tmp_path, capsys):
    """A file given as --out, or a path under one, ended in a traceback from mkdir."""
    blocker = tmp_path / "a-file"
    blocker.write_text("kept")
    for out in (blocker, blocker / "below"):
        with pytest.raises(SystemExit) as exit_info:
            probe_surfaces.main(["--out", str(out)])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert f"--out {out}: {blocker} is a file, not a folder" in err and "Traceback" not in err, err
    assert blocker.read_text() == "kept" and sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]
