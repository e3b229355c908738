"""Point-cloud domain: FPS and kNN kernels, the ModelNet/folder loader on written fixtures and its splits
(shipped folders, random, grouped; none following the training seed), the shape generator, augmentations
and the test-time perturbations."""
import logging
import re

import open3d as o3d
import pytest
import torch
from torch import nn

from common.data import SPLITS, DataError
from common.task import perturbation_generator
from domains.pointcloud import build
from domains.pointcloud.data import MalformedMesh, PointCloudDataModule, drop_points, folder_splits, off_lines
from domains.pointcloud.model import PointCloudTask, farthest_point_sample, gather_points, knn
from domains.pointcloud.shapes import SHAPES, generate_shapes
from runners.cli import main as cli
from runners.config import compose


def config(*overrides):
    return compose(["domain=pointcloud", "preset=smoke", *overrides])


def data_cfg(**over):
    """The smoke data section with 64 points per cloud and half the training clouds for validation."""
    return config("data.num_points=64", "data.batch_size=4", "data.val_fraction=0.5",
                  *(f"data.{key}={value}" for key, value in over.items())).data


def covering_radius(points, chosen):
    """How far the worst-covered point of the cloud is from its nearest chosen point."""
    return torch.cdist(points, chosen).amin(-1).amax(-1)


def test_fps_distinct_and_covers_better_than_random():
    torch.manual_seed(0)
    points = torch.rand(3, 400, 3)
    idx = farthest_point_sample(points, 32)
    assert all(len(set(row.tolist())) == 32 for row in idx)
    fps_radius = covering_radius(points, gather_points(points, idx))
    random_idx = torch.stack([torch.randperm(400)[:32] for _ in range(3)])
    assert (fps_radius < covering_radius(points, gather_points(points, random_idx))).all()


def test_knn_matches_brute_force():
    torch.manual_seed(0)
    points, query = torch.randn(2, 200, 3), torch.randn(2, 10, 3)
    idx = knn(query, points, 7)
    for b in range(2):
        for m in range(10):
            dist = [float(((query[b, m] - p) ** 2).sum()) for p in points[b]]
            expected = sorted(range(200), key=dist.__getitem__)[:7]
            assert idx[b, m].tolist() == expected


def write_modelnet_tree(root):
    """chair: OFF boxes (one with ModelNet's fused header, one unreadable); lamp: PLY spheres and a PLY
    point cloud; each class with train/ and test/ folders."""
    box, sphere = o3d.geometry.TriangleMesh.create_box(), o3d.geometry.TriangleMesh.create_sphere()
    for split, count in (("train", 4), ("test", 2)):
        (root / "chair" / split).mkdir(parents=True)
        (root / "lamp" / split).mkdir(parents=True)
        for i in range(count):
            o3d.io.write_triangle_mesh(str(root / "chair" / split / f"chair_{i}.off"), box)
            o3d.io.write_triangle_mesh(str(root / "lamp" / split / f"lamp_{i}.ply"), sphere, write_ascii=True)
    text = (root / "chair" / "train" / "chair_0.off").read_text()
    (root / "chair" / "train" / "chair_0.off").write_text(text.replace("OFF\n", "OFF", 1))
    (root / "chair" / "train" / "broken.off").write_text("not a mesh")
    o3d.utility.random.seed(0)
    cloud = sphere.sample_points_uniformly(1000)  # a dense scan, so its 64 farthest points spread evenly
    o3d.io.write_point_cloud(str(root / "lamp" / "test" / "scan.ply"), cloud)


def test_modelnet_layout_loads_with_labels_and_skips_broken(tmp_path, caplog):
    write_modelnet_tree(tmp_path / "ModelNet2")
    with caplog.at_level(logging.WARNING, logger="domains.pointcloud.data"):
        dm = PointCloudDataModule(data_cfg(dataset="modelnet", root=tmp_path / "ModelNet2"), tmp_path / "cache")
    assert dm.classes == ["chair", "lamp"]
    broken = str(tmp_path / "ModelNet2" / "chair" / "train" / "broken.off")
    assert f"1 unreadable or empty files skipped under {tmp_path / 'ModelNet2'}, e.g. {broken}" in caplog.text
    test_points, test_labels = dm.datasets["test"].tensors
    assert sorted(test_labels.tolist()) == [0, 0, 1, 1, 1]
    train_labels = torch.cat([dm.datasets["train"].tensors[1], dm.datasets["val"].tensors[1]])
    assert sorted(train_labels.tolist()) == [0] * 4 + [1] * 4  # validation comes out of train
    assert len(dm.datasets["val"]) == 4
    assert test_points.shape == (5, 64, 3)
    radius = test_points.norm(dim=-1).amax(-1)
    assert torch.allclose(radius, torch.ones(5)) and test_points.mean(1).abs().max() < 1e-5
    # The labels follow the folders: lamps are spheres (every point near radius 1), chairs boxes.
    norms = test_points.norm(dim=-1)
    assert (norms[test_labels == 1] > 0.8).all() and (norms[test_labels == 0] < 0.7).any(-1).all()


def test_folder_without_splits_and_bad_roots(tmp_path):
    write_modelnet_tree(tmp_path / "tree")
    dm = PointCloudDataModule(data_cfg(dataset="folder", root=tmp_path / "tree", test_fraction=0.25),
                              tmp_path / "cache")
    assert sum(len(s) for s in dm.datasets.values()) == 13  # 14 files, one unreadable
    with pytest.raises(DataError, match="data.root .*missing does not exist"):
        PointCloudDataModule(data_cfg(dataset="modelnet", root=tmp_path / "missing"), tmp_path)
    (tmp_path / "tree" / "empty_class").mkdir()
    with pytest.raises(DataError, match="empty_class"):
        PointCloudDataModule(data_cfg(dataset="folder", root=tmp_path / "tree"), tmp_path)
    flat = tmp_path / "flat" / "a"
    flat.mkdir(parents=True)
    o3d.io.write_triangle_mesh(str(flat / "a.off"), o3d.geometry.TriangleMesh.create_box())
    with pytest.raises(DataError, match="ModelNet layout"):
        PointCloudDataModule(data_cfg(dataset="modelnet", root=tmp_path / "flat"), tmp_path / "c2")


def train_on(tmp_path, *overrides) -> int:
    """``quest train`` of the point-cloud smoke preset, its outputs and cache in ``tmp_path``."""
    return cli(["train", "domain=pointcloud", "preset=smoke", "data.num_points=64", *overrides,
                f"output_dir={tmp_path}/runs", f"cache_dir={tmp_path}/cache", "trainer.enable_progress_bar=false"])


@pytest.mark.parametrize("dataset", ["folder", "modelnet"])
def test_a_file_as_data_root_is_named_in_one_line(tmp_path, capsys, dataset):
    file = tmp_path / "y.txt"
    file.write_text("not a folder")
    assert train_on(tmp_path, f"data.dataset={dataset}", f"data.root={file}") == 2
    err = capsys.readouterr().err
    assert f"data.root {file} is a file; dataset {dataset!r} needs a folder" in err and err.count("\n") == 1, err
    assert not (tmp_path / "runs").exists()


TETRAHEDRON = "OFF\n4 4 0\n0 0 0\n1 0 0\n0 1 0\n0 0 1\n3 0 1 2\n3 0 1 3\n3 0 2 3\n3 1 2 3\n"


@pytest.mark.parametrize("broken, problem", [
    ("3 1 2 12", "face 3 refers to vertex 12, but the mesh has 4 vertices"),
    ("3 1 2 -1", "face 3 refers to vertex -1, but the mesh has 4 vertices"),
    ("3 1 2 x", "face 3 is not 'k i1 ... ik' with k >= 3 whole numbers"),
    ("4 1 2 3", "face 3 is not 'k i1 ... ik' with k >= 3 whole numbers"),
    ("2 1 2", "face 3 is not 'k i1 ... ik' with k >= 3 whole numbers"),
    ("3 1 2 3\n3 0 1 2", "the header counts 4 vertices and 4 faces, but 9 lines follow"),
])
def test_off_lines_names_a_bad_face_before_open3d_reads_it(tmp_path, broken, problem):
    path = tmp_path / "bad.off"
    path.write_text(TETRAHEDRON.replace("3 1 2 3", broken))
    with pytest.raises(MalformedMesh, match=re.escape(f"{path}: {problem}")):
        off_lines(path)


@pytest.mark.parametrize("text, problem", [
    (TETRAHEDRON.replace("4 4 0", "4 4"), "the line after the OFF header should be 'vertices faces edges', not '4 4'"),
    (TETRAHEDRON.replace("4 4 0", "4 5 0"), "the header counts 4 vertices and 5 faces, but 8 lines follow"),
    (TETRAHEDRON.replace("0 1 0", "0 one 0"), "vertex 2 is not 3 or more numbers"),
    (TETRAHEDRON.replace("0 1 0", "0 1"), "vertex 2 is not 3 or more numbers"),
])
def test_off_lines_names_bad_counts_and_vertices(tmp_path, text, problem):
    path = tmp_path / "bad.off"
    path.write_text(text)
    with pytest.raises(MalformedMesh, match=re.escape(f"{path}: {problem}")):
        off_lines(path)


def test_off_lines_reads_every_header_open3d_reads_and_leaves_other_files_unreadable(tmp_path):
    path = tmp_path / "mesh.off"
    commented = "# by hand\n" + TETRAHEDRON.replace("\n3", "\n\n3")
    for text in (TETRAHEDRON, TETRAHEDRON.replace("OFF\n", "OFF"), TETRAHEDRON.replace("OFF\n", "OFF "), commented):
        path.write_text(text)
        assert off_lines(path) == TETRAHEDRON.splitlines()
    path.write_text(TETRAHEDRON.replace("OFF", "COFF").replace("0 0 1", "0 0 1 255 0 0 255"))
    assert off_lines(path)[0] == "COFF"
    path.write_text("not a mesh")
    assert off_lines(path) is None  # no OFF file: unreadable, so skipped


def test_a_malformed_mesh_stops_the_run_in_one_line(tmp_path, capsys):
    root = tmp_path / "ModelNet2"
    write_modelnet_tree(root)
    (root / "chair" / "train" / "broken.off").unlink()  # its warning would be a second line
    bad = root / "lamp" / "test" / "bad.off"
    bad.write_text(TETRAHEDRON.replace("3 1 2 3", "3 1 2 12"))
    assert train_on(tmp_path, "data.dataset=modelnet", f"data.root={root}") == 2  # open3d never reads it
    err = capsys.readouterr().err
    assert f"{bad}: face 3 refers to vertex 12, but the mesh has 4 vertices" in err and err.count("\n") == 1, err
    assert not (tmp_path / "runs").exists()


TRIANGLE_PLY = ("ply\nformat ascii 1.0\nelement vertex 3\nproperty float x\nproperty float y\nproperty float z\n"
                "element face 1\nproperty list uchar int vertex_indices\nend_header\n0 0 0\n1 0 0\n0 1 0\n3 0 1 2\n")


@pytest.mark.parametrize("broken, problem", [
    (TRIANGLE_PLY.replace("3 0 1 2", "3 0 1 7"), "face 0 refers to vertex 7, but the mesh has 3 vertices"),
    (TRIANGLE_PLY.replace("0 1 0", "0 1 nan"), "vertex 2 is [0.0, 1.0, nan] (the first that is not finite)"),
])
def test_a_ply_mesh_open3d_would_crash_on_stops_the_run_in_one_line(tmp_path, capsys, broken, problem):
    root = tmp_path / "ModelNet2"
    write_modelnet_tree(root)
    (root / "chair" / "train" / "broken.off").unlink()  # its warning would be a second line
    bad = root / "lamp" / "test" / "bad.ply"
    bad.write_text(broken)
    assert train_on(tmp_path, "data.dataset=modelnet", f"data.root={root}") == 2  # not a segfault: exit 139
    err = capsys.readouterr().err
    assert f"{bad}: {problem}" in err and err.count("\n") == 1, err
    assert not (tmp_path / "runs").exists()


def clouds(dm) -> dict[str, torch.Tensor]:
    return {split: dm.datasets[split].tensors[0] for split in SPLITS}


def same_split_for_two_training_seeds(tmp_path, *overrides):
    """The datamodules of training seeds 0 and 1, after checking that they split alike."""
    first, second = (build(config("data.num_points=64", f"cache_dir={tmp_path / 'cache'}", f"seed={seed}",
                                  *overrides))[0] for seed in (0, 1))
    assert first.split_info == second.split_info
    assert all(torch.equal(clouds(first)[s], clouds(second)[s]) for s in SPLITS)
    return first


def test_generated_shapes_follow_the_split_seed_not_the_training_seed(tmp_path):
    dm = same_split_for_two_training_seeds(tmp_path)
    assert dm.split_info["source"] == "random" and len(dm.datasets["test"]) == len(SHAPES)
    other = build(config("data.num_points=64", f"cache_dir={tmp_path / 'cache'}", "data.split_seed=1"))[0]
    assert not torch.equal(clouds(other)["test"], clouds(dm)["test"])
    assert other.split_info["hash"]["test"] != dm.split_info["hash"]["test"]


@pytest.mark.parametrize("dataset", ["modelnet", "folder"])
def test_real_trees_split_alike_for_every_training_seed(tmp_path, dataset):
    write_modelnet_tree(tmp_path / "ModelNet2")
    dm = same_split_for_two_training_seeds(tmp_path, f"data.dataset={dataset}", f"data.root={tmp_path / 'ModelNet2'}")
    assert dm.split_info["source"] == {"modelnet": "shipped", "folder": "random"}[dataset]


def test_folder_split_folders_and_grouped_split(tmp_path):
    box = o3d.geometry.TriangleMesh.create_box()
    for split, objects in (("train", range(4)), ("test", range(4, 6))):
        for name in ("chair", "lamp"):
            (tmp_path / "split" / split / name).mkdir(parents=True)
            for obj in objects:
                for scan in range(2):
                    o3d.io.write_triangle_mesh(str(tmp_path / "split" / split / name / f"o{obj}_scan{scan}.off"), box)
    dm = PointCloudDataModule(data_cfg(dataset="folder", root=tmp_path / "split"), tmp_path / "cache")
    assert dm.split_info["source"] == "shipped" and dm.classes == ["chair", "lamp"]
    assert len(dm.datasets["test"]) == 8 and len(dm.datasets["train"]) + len(dm.datasets["val"]) == 16

    flat = tmp_path / "split" / "train"  # 4 objects x 2 scans per class, grouped by object
    data = data_cfg(dataset="folder", root=flat, test_fraction=0.25, group_pattern="(?P<group>[a-z]+/o\\d+)_scan")
    datasets, _, split = folder_splits(data, tmp_path / "cache")
    objects = {name: {member.split("_scan")[0] for member in members} for name, members in split.members.items()}
    assert split.source == "grouped" and {name: len(found) for name, found in objects.items()} == \
        {"train": 3, "val": 3, "test": 2}  # 2 of 8 objects held out, half the rest validating
    assert sum(map(len, objects.values())) == len(set().union(*objects.values()))  # no object in two splits
    assert {name: len(datasets[name]) for name in SPLITS} == {"train": 6, "val": 6, "test": 4}


def test_generated_shapes_deterministic_per_seed():
    cfg = config().data.shapes
    assert len(SHAPES) >= 10
    points, labels = generate_shapes(1, 48, seed=3, cfg=cfg)
    again, _ = generate_shapes(1, 48, seed=3, cfg=cfg)
    other, _ = generate_shapes(1, 48, seed=4, cfg=cfg)
    assert points.shape == (len(SHAPES), 48, 3) and labels.tolist() == list(range(len(SHAPES)))
    assert torch.equal(points, again) and not torch.equal(points, other)
    assert torch.isfinite(points).all()


def test_drop_points_keeps_size_and_only_kept_positions():
    torch.manual_seed(0)
    points = torch.randn(4, 200, 3)
    out = drop_points(points, 0.5)
    assert out.shape == points.shape
    for b in range(4):
        original = {tuple(p) for p in points[b].tolist()}
        positions = {tuple(p) for p in out[b].tolist()}
        assert positions <= original and 60 < len(positions) < 140


def test_perturbations_follow_the_task_config():
    cfg = config()
    task = PointCloudTask(nn.Identity(), len(SHAPES), cfg.optim, seed=cfg.seed, **dict(cfg.task))
    assert sorted(task.perturbations) == ["dropout", "jitter"]  # logged as test/acc_dropout, test/acc_jitter
    torch.manual_seed(0)
    points = torch.randn(4, 200, 3)
    for condition, settings in task.perturbations.items():
        once, again = (task.perturb(points, condition, settings, perturbation_generator(0, 3, condition, points.device))
                       for _ in range(2))
        assert once.shape == points.shape and torch.equal(once, again) and not torch.equal(once, points)
    jittered = task.perturb(points, "jitter", task.perturbations["jitter"], torch.Generator().manual_seed(0))
    assert (jittered - points).abs().max() <= task.perturbations["jitter"].clip + 1e-6
