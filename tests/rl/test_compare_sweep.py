"""compare_runs figures from metrics files; sweep grids."""

import json

import ml_collections
import pytest

from tlt_jax.rl.compare import amdahl_bound, compare_runs, read_metrics
from tlt_jax.sweep import as_grid, grid_points, point_args, point_name


def write_run(path, rows):
  path.mkdir()
  (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_compare_runs_figures(tmp_path):
  base = [{"step": s, "reward": 0.1 * s, "step_s": 10.0, "rollout_s": 6.0,
           "rollout/tokens_per_s": 100.0} for s in range(4)]
  tlt = [{"step": s, "reward": 0.1 * s, "step_s": 7.0, "rollout_s": 3.0, "spec/accept_len": 2.0,
          "rollout/tokens_per_s": 100.0 * 2 ** (s - 2)} for s in range(4)]
  tlt[0]["step_s"] = 100.0  # first step: left out of the timings
  # compile seconds are reported apart
  tlt[2].update({"step_s": 9.0, "rollout_s": 5.0, "time/compile_s": 2.0})
  write_run(tmp_path / "a", base)
  write_run(tmp_path / "b", tlt)
  out = compare_runs(str(tmp_path / "a"), str(tmp_path / "b"))
  assert out["reward_max_abs_diff"] == 0.0 and out["rewards_identical"]
  assert out["rollout_share"] == pytest.approx(0.6)
  assert out["rollout_speedup"] == pytest.approx(2.0)
  assert out["rollout_token_speedup"] == pytest.approx(1.0)  # steps 1-3: 0.5x, 1x, 2x per token
  assert out["e2e_speedup"] == pytest.approx(10 / 7, abs=1e-4)
  assert out["amdahl_bound"] == pytest.approx(1 / (0.4 + 0.3), abs=1e-4)
  assert out["compile_s_tlt"] == 2.0 and out["compile_s_baseline"] == 0.0
  assert amdahl_bound(1.0, 3.0) == pytest.approx(3.0) and amdahl_bound(0.0, 9.0) == 1.0


def test_compare_runs_reports_reward_differences_and_resumed_duplicates(tmp_path):
  write_run(tmp_path / "a", [{"step": 0, "reward": 0.5, "step_s": 1, "rollout_s": 1},
                             {"step": 1, "reward": 0.7, "step_s": 1, "rollout_s": 1}])
  # A killed run re-did step 1: the last record of a step wins.
  write_run(tmp_path / "b", [{"step": 0, "reward": 0.5, "step_s": 1, "rollout_s": 1},
                             {"step": 1, "reward": 0.0, "step_s": 1, "rollout_s": 1},
                             {"step": 1, "reward": 0.6, "step_s": 1, "rollout_s": 1}])
  assert len(read_metrics(str(tmp_path / "b"))) == 2
  assert compare_runs(str(tmp_path / "a"), str(tmp_path / "b"))["reward_max_abs_diff"] == \
      pytest.approx(0.1)
  with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
    read_metrics(str(tmp_path / "missing"))


def test_sweep_grid_points_and_arguments():
  pts = grid_points({"seed": (0, 1), "optim.lr": (1e-3, 2e-3)})
  assert pts == [{"seed": 0, "optim.lr": 1e-3}, {"seed": 0, "optim.lr": 2e-3},
                 {"seed": 1, "optim.lr": 1e-3}, {"seed": 1, "optim.lr": 2e-3}]
  assert len({point_name(p) for p in pts}) == 4
  args = point_args("--config=c.py", pts[1], "runs/sw")
  assert args == ["--config=c.py", "--config.out_dir=runs/sw/seed=0,optim.lr=0.002",
                  "--config.seed=0", "--config.optim.lr=0.002"]
  with pytest.raises(ValueError, match="No sweep grid"):
    grid_points({})
  with pytest.raises(ValueError, match="non-empty list"):
    grid_points({"seed": 3})


def test_a_grid_in_each_written_form():
  want = {"rl.optim.lr": [1e-4, 2e-4], "seed": [0, 1]}
  assert as_grid('{"rl.optim.lr": [1e-4, 2e-4], "seed": [0, 1]}') == want
  assert as_grid((("rl.optim.lr", [1e-4, 2e-4]), ("seed", [0, 1]))) == want
  assert as_grid(ml_collections.ConfigDict({"rl": {"optim": {"lr": [1e-4, 2e-4]}},
                                            "seed": [0, 1]})) == want
  with pytest.raises(ValueError, match="--grid is not a JSON object"):
    as_grid("{rl.optim.lr: [1]}")
  with pytest.raises(ValueError, match="must be \\(field, values\\) pairs"):
    as_grid(("seed",))
