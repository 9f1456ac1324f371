"""Latency surfaces (model, CSV, engine profile) and workloads of the twin."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from vllm_ascend_patchset.paths import CPU_SURFACE
from vllm_ascend_patchset.twin.pipeline import Chunk
from vllm_ascend_patchset.twin.stress import STRESS_SURFACES
from vllm_ascend_patchset.twin.surface import SYNTHETIC, GridSurface, QuadraticSurface, StageTimer, batch_ms, request_ms
from vllm_ascend_patchset.twin.surface_files import load_surface
from vllm_ascend_patchset.twin.workloads import long_prompt, mixed, prompt_token_ids

TRUE = QuadraticSurface(5.0, 0.04, 1e-4, 3e-6, 2e-6, name="true")


def grid_points(surface, chunks=(256, 512, 1024, 2048), histories=(0, 4096, 16384)):
    return [(c, h, surface.time_ms(c, h)) for c in chunks for h in histories]


def test_fit_recovers_the_coefficients_of_a_noiseless_surface():
    fitted = QuadraticSurface.fit(grid_points(TRUE))
    assert fitted.coefficients == pytest.approx(TRUE.coefficients, rel=1e-6, abs=1e-12)


def test_a_batch_pays_the_fixed_cost_once_and_each_request_its_own_attention():
    one = TRUE.time_ms(1024, 8192)
    assert batch_ms(TRUE, [(1024, 8192)]) == pytest.approx(one)
    two = batch_ms(TRUE, [(1024, 8192), (1, 30000)])
    assert two == pytest.approx(one + TRUE.time_ms(1, 30000) - TRUE.fixed_ms)
    assert batch_ms(TRUE, []) == 0.0


def test_csv_grid_is_exact_on_its_points_and_uses_the_fit_outside(tmp_path):
    path = tmp_path / "surface.csv"
    rows = ["# measured on a test", "chunk_tokens,history_tokens,latency_ms"]
    rows += [f"{c},{h},{ms}" for c, h, ms in grid_points(TRUE)]
    path.write_text("\n".join(rows) + "\n")
    surface = load_surface(str(path))
    assert isinstance(surface, GridSurface)
    assert surface.time_ms(512, 4096) == pytest.approx(TRUE.time_ms(512, 4096))
    # Outside the grid (longer history than measured) the fitted model answers.
    assert surface.time_ms(1024, 65536) == pytest.approx(TRUE.time_ms(1024, 65536), rel=1e-6)


def test_csv_without_the_latency_column_is_refused_with_the_expected_header(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("chunk_tokens,history_tokens,ms\n256,0,1.0\n")
    with pytest.raises(ValueError, match="latency_ms"):
        load_surface(str(path))


def test_engine_profile_json_gives_its_accepted_model(tmp_path):
    profile = {
        "schema_version": 1,
        "fingerprint": {"model": "x"},
        "base_chunk_size": 8192,
        "coefficients": {"c0_ms": 5.0, "c1_ms": 0.04, "c2_ms": 1e-4, "c3_ms": 3e-6, "c4_ms": 2e-6, "mape": 0.01},
        "target_ms": 1.0,
        "samples": [[256, 0, 16.0]],
    }
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile))
    assert load_surface(str(path)).coefficients == pytest.approx(TRUE.coefficients)
    # Taken at PP 4, each sample is one stage's time: the whole model costs four times as much.
    profile["fingerprint"]["pipeline_parallel_size"] = 4
    path.write_text(json.dumps(profile))
    assert load_surface(str(path)).coefficients == pytest.approx(tuple(4 * c for c in TRUE.coefficients))


def test_profile_without_coefficients_falls_back_to_its_samples(tmp_path):
    samples = [[c, h, ms] for c, h, ms in grid_points(TRUE)]
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"schema_version": 1, "coefficients": None, "samples": samples}))
    assert load_surface(str(path)).time_ms(1024, 4096) == pytest.approx(TRUE.time_ms(1024, 4096))


def test_committed_cpu_surface_loads_when_present():
    path = CPU_SURFACE
    if not path.exists():
        pytest.skip("tests/data/cpu_surface.csv is produced by the latency-model work")
    surface = load_surface(str(path))
    # Attention makes later chunks dearer: the same chunk costs more after a long history.
    assert surface.time_ms(2048, 32768) > surface.time_ms(2048, 0) > 0


@pytest.mark.parametrize(
    "spec, message",
    [("quadratic:1,2", "five ms coefficients"), ("nonexistent.csv", "no such file"), ("quadratic:1,2,3,4,-1", ">= 0")],
)
def test_bad_surface_specs_say_what_to_give(spec, message):
    with pytest.raises(ValueError, match=message):
        load_surface(spec)


def test_stage_timer_splits_by_layer_share_and_reports_the_last_stage_for_profiling():
    timer = StageTimer.build(TRUE, 4, layers=(10, 10, 10, 20))
    chunks = (Chunk("r", 2048, 0, True, False),)
    stage_ms = timer(chunks, 0)
    assert sum(stage_ms) == pytest.approx(TRUE.time_ms(2048, 0))
    assert stage_ms[3] == pytest.approx(2 * stage_ms[0])
    assert timer.profile_stage_ms(2048, 0, 0) == pytest.approx(stage_ms)
    with pytest.raises(ValueError, match="one per stage"):
        StageTimer.build(TRUE, 4, layers=(10, 10))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), index=st.integers(0, 10_000))
def test_stage_noise_repeats_with_the_seed_and_averages_near_one(seed, index):
    timer = StageTimer.build(TRUE, 2, noise_sigma=0.1, seed=seed)
    chunks = (Chunk("r", 1024, 4096, True, False),)
    assert timer(chunks, index) == timer(chunks, index)
    plain = TRUE.time_ms(1024, 4096) / 2
    assert all(0.5 * plain < ms < 2.0 * plain for ms in timer(chunks, index))


def test_same_seed_same_mixed_workload_other_seed_other_workload():
    a = mixed(SYNTHETIC, 4, seed=3, num_requests=12)
    assert a == mixed(SYNTHETIC, 4, seed=3, num_requests=12)
    assert a != mixed(SYNTHETIC, 4, seed=4, num_requests=12)
    assert all(4096 <= r.prompt_tokens <= 65536 for r in a.requests)
    assert [r.arrival_ms for r in a.requests] == sorted(r.arrival_ms for r in a.requests)


def test_prefix_hits_share_exactly_their_group_prefix():
    workload = mixed(SYNTHETIC, 4, seed=1, num_requests=30, prefix_hit_share=0.5)
    by_group: dict[int, list] = {}
    for spec in workload.requests:
        by_group.setdefault(spec.prefix_group, []).append(spec)
    shared = [group for group in by_group.values() if len(group) > 1]
    assert shared, "a 50% hit share over 30 requests produces at least one shared prefix"
    for founder, *hits in shared:
        founder_ids = prompt_token_ids(founder, workload.seed)
        for hit in hits:
            hit_ids = prompt_token_ids(hit, workload.seed)
            assert hit_ids[: hit.group_tokens] == founder_ids[: hit.group_tokens]
            assert hit_ids[hit.group_tokens : hit.group_tokens + 64] != founder_ids[hit.group_tokens :][:64]


def test_long_prompt_is_one_request_at_time_zero():
    workload = long_prompt(131072)
    assert workload.name == "long-128k"
    assert [(r.arrival_ms, r.prompt_tokens) for r in workload.requests] == [(0.0, 131072)]


def test_a_profile_saved_by_our_engine_code_loads_as_its_samples(tmp_path):
    """Round trip through the real persistence code (core/cpp_profile_store.py): the grid the engine measured."""
    store = pytest.importorskip("vllm_ascend.core.cpp_profile_store")
    from vllm_ascend.core.cpp_profiling import profile_plan

    stage = QuadraticSurface(*(c / 2 for c in TRUE.coefficients))
    plan = profile_plan(base_chunk_tokens=2048, points=24, repeats=1, history_points=2, max_history_tokens=16384)
    samples = [(c, h, stage.time_ms(c, h)) for c, h in plan]
    path = tmp_path / "profile.json"
    store.save_profile(path, fingerprint={"pipeline_parallel_size": 2}, base_chunk_tokens=2048, samples=samples)
    surface = load_surface(str(path))
    assert surface.time_ms(1024, 8192) == pytest.approx(TRUE.time_ms(1024, 8192), rel=1e-9)
    assert surface.time_ms(1000, 4096) == pytest.approx(TRUE.time_ms(1000, 4096), rel=0.02)


# ---------------------------------------------------------------- what request_ms means, here and in the model
def test_request_ms_is_a_requests_own_cost_in_the_twin_as_in_the_latency_model():
    model_module = pytest.importorskip("vllm_ascend.core.cpp_latency_model")
    from vllm_ascend.core.cpp_samples import Point

    chunks, histories = (1, 64, 256, 1024), (0, 8192)
    model = model_module.LatencyModel.from_points(
        [Point(c, h, TRUE.time_ms(c, h), 1) for h in histories for c in chunks]
    )
    for surface in (TRUE, SYNTHETIC, STRESS_SURFACES["knee"]):
        assert request_ms(surface, 256, 100) == pytest.approx(surface.time_ms(256, 100) - surface.fixed_ms)
    assert model.request_ms(256, 8192) == pytest.approx(request_ms(TRUE, 256, 8192), rel=1e-3)


# ---------------------------------------------------------------- measured grids, ragged ones too
def test_a_ragged_grid_keeps_every_measured_row():
    """More chunk sizes without history than with it (a profile's tile probe, a CSV measured that way)."""
    points = [(c, 0, TRUE.time_ms(c, 0)) for c in (256, 384, 512, 768, 1024, 2048)]
    points += [(c, h, TRUE.time_ms(c, h)) for c in (256, 1024, 2048) for h in (8192, 32768)]
    surface = GridSurface.from_points(points, name="ragged")
    assert len(surface.levels) == 3
    for c, h, ms in points:
        assert surface.time_ms(c, h) == pytest.approx(ms, rel=1e-12)
    assert surface.time_ms(640, 16384) == pytest.approx(TRUE.time_ms(640, 16384), rel=0.05)


def test_the_committed_cpu_surface_is_its_measurements_not_a_fit():
    surface = load_surface(str(CPU_SURFACE))
    assert isinstance(surface, GridSurface) and len(surface.levels) >= 5


@pytest.mark.parametrize("name", sorted(STRESS_SURFACES))
def test_every_stress_surface_grows_with_chunk_and_history_but_at_its_odd_points(name):
    surface = load_surface(f"stress:{name}")
    chunks = np.arange(1, 8193, 7, dtype=np.float64)
    for history in (0, 10_000, 40_000):
        times = surface.time_ms_many(chunks, history)
        assert np.all(times > 0) and np.all(times >= surface.fixed_ms)
        if surface.monotone:  # (odd points and sweet spots fall where they are: the test below)
            assert np.all(np.diff(times) >= -1e-9)
    assert surface.time_ms(2048, 60_000) > surface.time_ms(2048, 0)
    assert surface.fixed_ms <= surface.time_ms(1, 0)


def test_odd_points_and_sweet_spots_fall_where_they_are_and_nowhere_else():
    odd1, odd3, sweet = STRESS_SURFACES["odd1"], STRESS_SURFACES["odd3"], STRESS_SURFACES["sweet"]
    # odd1: at depth a 768-token chunk takes less than a 512-token one; without history it does not.
    assert odd1.time_ms(768, 28_672) < 0.9 * odd1.time_ms(512, 28_672)
    assert odd1.time_ms(768, 0) > odd1.time_ms(512, 0)
    # odd3: three points 30-45% below a smaller chunk or a shallower history at the same size.
    for chunk, history, _ in odd3.points:
        below = max(odd3.time_ms(chunk / 1.5, history), odd3.time_ms(chunk, history - 8192))
        assert 0.55 <= odd3.time_ms(chunk, history) / below <= 0.87, (chunk, history)
    assert len(STRESS_SURFACES["odd10"].points) == 10 and not odd1.monotone
    # sweet: only the sizes themselves are cheaper; one token either side costs the surface's own time.
    for size, _ in sweet.points:
        assert sweet.time_ms(size, 4096) < 0.8 * sweet.time_ms(size - 1, 4096)
        assert sweet.time_ms(size + 1, 4096) > sweet.time_ms(size - 1, 4096)


@pytest.mark.parametrize("name", ["bent1k-sharp", "bent1k-soft", "bent1536"])
def test_bent_surfaces_are_flat_per_token_up_to_their_knee_then_steep(name):
    surface = STRESS_SURFACES[name]
    knee = surface.size_tokens
    sizes = np.array([knee / 4, knee / 2, 2 * knee])
    per_token = surface.time_ms_many(sizes, 0) / sizes
    assert abs(per_token[1] / per_token[0] - 1) < 0.25 and per_token[2] > 2.5 * per_token[1]
    assert surface.fixed_ms == 2.0


def test_stress_shapes_are_what_their_mechanisms_say():
    cache, knee = STRESS_SURFACES["cache"], STRESS_SURFACES["knee"]
    per_token = cache.time_ms_many(np.array([256.0, 1024.0, 1536.0, 4096.0]), 0) / [256, 1024, 1536, 4096]
    assert per_token[2] < per_token[0] and per_token[3] > 1.5 * per_token[2]  # flat, then steep
    tiles = STRESS_SURFACES["tiles256"]
    assert tiles.time_ms(257, 0) == pytest.approx(tiles.time_ms(512, 0)) and tiles.time_ms(256, 0) < tiles.time_ms(
        257, 0
    )
    line = knee.time_ms(2048, 0) + (knee.time_ms(4096, 0) - knee.time_ms(2048, 0)) / 2048 * (64 - 2048)
    assert knee.time_ms(64, 0) < line  # small chunks are cheaper than the line through large ones
    switch = STRESS_SURFACES["attn-switch"]
    assert switch.time_ms(1024, 24_576) - switch.time_ms(1024, 24_575) > 0.1 * switch.pair_ms * 1024 * 24_576


def test_a_measured_surface_never_prices_a_request_below_nothing():
    """A surface measured down to one token, whose per-step overhead grows over the first few hundred
    tokens (a knee), bends the quadratic fit's constant above the smallest measured steps. The twin's
    fixed cost stays at most what a step was measured to take, so a decode costs 0 or more and a batch
    of many decodes is no shorter than one of them alone."""
    knee = STRESS_SURFACES["knee"]
    points = [(c, h, knee.time_ms(c, h)) for c in (1, 16, 64, 256, 1024, 4096, 8192) for h in (0, 8192, 32768, 131072)]
    surface = GridSurface.from_points(points, name="knee grid")
    assert surface.fit.fixed_ms > surface.time_ms(1, 0)  # the case this guards against
    assert surface.fixed_ms <= min(ms for _, _, ms in points)
    for c in (1, 2, 16, 300, 8192, 20_000):
        for h in (0, 5000, 131072, 200_000):
            assert request_ms(surface, c, h) >= 0.0, (c, h)
    decodes = [(1, 4096)] * 200
    assert batch_ms(surface, decodes) >= surface.time_ms(1, 4096)


def test_an_unknown_stress_surface_lists_the_known_ones():
    with pytest.raises(ValueError, match="cache, knee"):
        load_surface("stress:spiky")


# ---------------------------------------------------------------- surface files are untrusted input
def write_csv(tmp_path, rows, header="chunk_tokens,history_tokens,latency_ms", prefix=""):
    path = tmp_path / "surface.csv"
    path.write_text(prefix + header + "\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "row, message",
    [
        ("256,0,5e-324", "surface.csv:3: latency_ms"),
        ("256,0,1e-300", "surface.csv:3: latency_ms"),
        ("256,0,1e30", "surface.csv:3: latency_ms"),
        ("1e30,0,5.0", "surface.csv:3: chunk_tokens"),
        ("256,1e30,5.0", "surface.csv:3: history_tokens"),
        ("256,0,nan", "surface.csv:3: latency_ms"),
        ("256.5,0,5.0", "surface.csv:3: chunk_tokens"),
    ],
)
def test_a_value_no_device_measures_is_refused_naming_file_and_line(tmp_path, row, message):
    path = write_csv(tmp_path, ["128,0,3.0", row, "512,0,9.0"])
    with pytest.raises(ValueError, match=message):
        load_surface(str(path))


def test_a_csv_with_a_byte_order_mark_is_read_as_spreadsheet_tools_write_it(tmp_path):
    rows = [f"{c},{h},{ms}" for c, h, ms in grid_points(TRUE)]
    path = write_csv(tmp_path, rows, prefix="\ufeff")
    assert load_surface(str(path)).time_ms(512, 4096) == pytest.approx(TRUE.time_ms(512, 4096))


@pytest.mark.parametrize(
    "text, message",
    [
        ("[" * 100_000 + "]" * 100_000, "profile.json: not a JSON profile"),
        ('{"samples": [[256, 0, ' + "9" * 5000 + "]]}", "profile.json"),
        ('{"samples": [[256, 0, 1.0], "x"]}', "samples\\[1\\]"),
    ],
)
def test_a_broken_profile_json_is_refused_naming_the_file(tmp_path, text, message):
    path = tmp_path / "profile.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_surface(str(path))
