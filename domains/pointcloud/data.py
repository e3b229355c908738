"""Point-cloud classification data: generated shapes (default), ModelNet10/40 in its original
``<class>/{train,test}/*.off`` layout, or any class-per-folder tree of meshes or point files, all read
and sampled with open3d, normalised to the unit sphere and cached as [M, num_points, 3] tensors.
``LOADERS`` (at the end) maps each dataset name to its loader. Training batches are augmented on the
device (scale/shift, jitter, point dropout); jitter and dropout are also the task's test-time
perturbations.

Splits never follow the training seed: the shapes are generated per split from ``data.split_seed``,
ModelNet's train/ and test/ folders are used as shipped (validation carved out of train/), and a folder
tree's split folders (``<root>/{train,val,test}/<class>/``) likewise; a single tree is split from
``data.split_seed``, at random or grouped by ``data.group_pattern`` (e.g. the object a scan shows)."""
from __future__ import annotations

import logging
import re
import tempfile
from functools import partial
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import TensorDataset

from common.data import (
    SPLITS,
    DataError,
    Split,
    SplitDataModule,
    cached,
    carve_validation,
    check_finite_array,
    class_folder_files,
    class_folder_splits,
    data_root,
    grouping,
    named,
    shipped_split,
    short_hash,
    split_folders,
    split_names,
)
from common.files import regular_file
from common.optional import require

from .config import Data
from .shapes import SHAPES, generate_shapes

o3d = require("open3d", extra="pointcloud")

log = logging.getLogger(__name__)

MESH_EXTENSIONS = (".off", ".obj", ".ply", ".stl")
POINT_EXTENSIONS = (".pcd", ".xyz", ".xyzn", ".xyzrgb", ".pts")
# Meshes are sampled once for every run that shares the cache, so their sampling seed is fixed.
SAMPLING_SEED = 0


# --- reading -------------------------------------------------------------------------------------

OFF_HEADER = re.compile(r"(C?N?OFF)\s*(.*)")  # the keywords open3d reads, then counts on the same line or none


class MalformedMesh(DataError):
    """A mesh file that breaks its own format, or a mesh or point file holding a coordinate that is not finite: the
    user's to fix (exit 2), where an unreadable one is skipped."""


def off_lines(path: Path) -> list[str] | None:
    """The lines of an OFF file for open3d's reader (comments and blank lines dropped, the header keyword on
    a line of its own), once checked: open3d trusts the face indices, and one past the vertices makes its
    sampling segfault. Three counts, then as many vertex lines (3 or more numbers) and face lines
    (``k i1 ... ik``, k >= 3, each index a vertex) as they say, else a ``MalformedMesh`` saying what is
    wrong. None for a file without an OFF header: no OFF mesh at all, so unreadable."""
    lines = [line for line in map(str.strip, path.read_text(errors="replace").splitlines())
             if line and not line.startswith("#")]
    header = OFF_HEADER.fullmatch(lines[0]) if lines else None
    if header is None:
        return None
    # open3d wants the counts on a line of their own; many ModelNet files fuse them with the header ("OFF490 518 0").
    lines[:1] = [header[1], header[2]] if header[2] else [header[1]]
    counts = lines[1].split() if len(lines) > 1 else []
    if len(counts) != 3 or not all(count.isdecimal() for count in counts):
        raise MalformedMesh(f"{path}: the line after the OFF header should be 'vertices faces edges', "
                            f"not {' '.join(counts)!r}")
    n_vertices, n_faces = int(counts[0]), int(counts[1])
    if len(lines) - 2 != n_vertices + n_faces:
        raise MalformedMesh(f"{path}: the header counts {n_vertices} vertices and {n_faces} faces, "
                            f"but {len(lines) - 2} lines follow")
    for number, line in enumerate(lines[2:2 + n_vertices]):
        values = _parsed(line.split(), float)
        if values is None or len(values) < 3:
            raise MalformedMesh(f"{path}: vertex {number} is not 3 or more numbers")
    for number, line in enumerate(lines[2 + n_vertices:]):
        size, *rest = line.split()  # k, its k indices, perhaps a colour
        indices = _parsed(rest[:int(size)], int) if size.isdecimal() else None
        if indices is None or not 3 <= int(size) == len(indices):
            raise MalformedMesh(f"{path}: face {number} is not 'k i1 ... ik' with k >= 3 whole numbers")
        outside = next((index for index in indices if not 0 <= index < n_vertices), None)
        if outside is not None:
            raise MalformedMesh(f"{path}: face {number} refers to vertex {outside}, "
                                f"but the mesh has {n_vertices} vertices")
    return lines


def _parsed(tokens: list[str], kind: type) -> list | None:
    """``tokens`` read as ``kind`` (int or float), or None where one does not read."""
    try:
        return [kind(token) for token in tokens]
    except ValueError:
        return None


def _read_mesh(path: Path) -> o3d.geometry.TriangleMesh:
    if path.suffix.lower() != ".off":
        return o3d.io.read_triangle_mesh(str(path))
    lines = off_lines(path)
    if lines is None:
        return o3d.geometry.TriangleMesh()  # no triangles: unreadable
    # open3d reads the lines as checked, so nothing it reads went unchecked.
    with tempfile.NamedTemporaryFile("w", suffix=".off") as checked:
        checked.write("\n".join(lines))
        checked.flush()
        return o3d.io.read_triangle_mesh(checked.name)


def check_mesh(mesh: o3d.geometry.TriangleMesh, path: Path) -> None:
    """A ``MalformedMesh`` unless every face names a vertex the mesh has and every vertex is finite, whatever
    the format: open3d reads a face index past the vertices as it is, and sampling it then segfaults."""
    vertices, faces = np.asarray(mesh.vertices), np.asarray(mesh.triangles)
    outside = (faces < 0) | (faces >= len(vertices))
    if outside.any():
        face = int(outside.any(1).argmax())
        raise MalformedMesh(f"{path}: face {face} refers to vertex {faces[face][outside[face]][0]}, "
                            f"but the mesh has {len(vertices)} vertices")
    check_finite_array(vertices, path, "vertex", MalformedMesh)


def read_points(path: Path, num_points: int, rng: np.random.Generator) -> np.ndarray:
    """``num_points`` points from a mesh (uniform surface samples) or a point file (farthest-point
    subset, or resampled with repetition when it has fewer). An unreadable or empty file is a DataError, a
    mesh that breaks its format (``off_lines``, ``check_mesh``) or a point that is not finite a ``MalformedMesh``."""
    regular_file(path, "mesh or point file")  # a FIFO would hang open3d's reader
    with o3d.utility.VerbosityContextManager(o3d.utility.VerbosityLevel.Error):
        mesh = _read_mesh(path) if path.suffix.lower() in MESH_EXTENSIONS else None
        if mesh is not None and mesh.has_triangles():
            check_mesh(mesh, path)
            return np.asarray(mesh.sample_points_uniformly(num_points).points, dtype=np.float32)
        cloud = o3d.io.read_point_cloud(str(path))  # point files, and PLY files without faces
    if not cloud.has_points():
        raise DataError(f"{path}: unreadable or empty mesh/point file")
    check_finite_array(np.asarray(cloud.points), path, "point", MalformedMesh)
    if len(cloud.points) >= num_points:
        cloud = cloud.farthest_point_down_sample(num_points)
        return np.asarray(cloud.points, dtype=np.float32)
    points = np.asarray(cloud.points, dtype=np.float32)
    return points[rng.choice(len(points), num_points)]


def normalise_unit_sphere(points: Tensor) -> Tensor:
    """Centre each cloud [..., N, 3] on its mean and scale its farthest point to radius 1."""
    points = points - points.mean(-2, keepdim=True)
    return points / points.norm(dim=-1).amax(-1)[..., None, None].clamp_min(1e-12)


def sample_files(files: list[tuple[Path, int]], num_points: int) -> dict:
    """Every file sampled to ``num_points``; unreadable ones are reported by path, skipped and counted, a
    malformed one raises. ``kept`` lists the indices into ``files`` of the clouds returned."""
    rng = np.random.default_rng(SAMPLING_SEED)
    o3d.utility.random.seed(SAMPLING_SEED)
    points, labels, kept, skipped = [], [], [], []
    for index, (path, label) in enumerate(files):
        try:
            points.append(read_points(path, num_points, rng))
        except MalformedMesh:
            raise  # not a file to leave out: the user's to fix
        except DataError as err:
            log.warning("skipped %s", err)
            skipped.append(str(path))
            continue
        labels.append(label)
        kept.append(index)
    if not points:
        raise DataError(f"no readable mesh or point file among {len(files)} files")
    return {"points": normalise_unit_sphere(torch.from_numpy(np.stack(points))),
            "labels": torch.tensor(labels), "kept": kept, "skipped": skipped}


# --- augmentation (batched, on any device) ------------------------------------------------------

def _rand(shape, points: Tensor, generator: torch.Generator | None) -> Tensor:
    return torch.rand(shape, device=points.device, dtype=points.dtype, generator=generator)


def scale_shift(points: Tensor, scale: tuple[float, float], shift: float, generator=None) -> Tensor:
    """Random per-axis scale in ``scale`` and translation in [-shift, shift] per cloud."""
    low, high = scale
    factors = low + (high - low) * _rand((points.shape[0], 1, 3), points, generator)
    offsets = shift * (2 * _rand((points.shape[0], 1, 3), points, generator) - 1)
    return points * factors + offsets


def jitter(points: Tensor, sigma: float, clip: float, generator=None) -> Tensor:
    noise = torch.randn(points.shape, device=points.device, dtype=points.dtype, generator=generator)
    return points + (sigma * noise).clamp(-clip, clip)


def drop_points(points: Tensor, ratio: Tensor | float, generator=None) -> Tensor:
    """Drop a ``ratio`` of each cloud's points (per cloud when a [B] tensor) and fill the freed slots
    with copies of kept points, so the set of positions is the kept subset and N stays fixed."""
    batch, n = points.shape[:2]
    ratio = torch.as_tensor(ratio, device=points.device, dtype=points.dtype).expand(batch)
    dropped = _rand((batch, n), points, generator) < ratio[:, None]
    dropped[:, 0] = False  # never an empty cloud
    # Kept points first, in random order; then each slot reads a kept point (itself, if it was kept).
    order = torch.argsort(dropped.to(points.dtype) + _rand((batch, n), points, generator), dim=1)
    kept = (~dropped).sum(1, keepdim=True)
    slot = (_rand((batch, n), points, generator) * kept).long().minimum(kept - 1)  # float rounding can reach kept
    slot = torch.where(dropped, slot, 0)
    source = torch.where(dropped, order.gather(1, slot), torch.arange(n, device=points.device))
    return points.gather(1, source[..., None].expand(-1, -1, 3))


# --- datasets: each loader gives (datasets per split, class names, how they were split) ------------

Splits = tuple[dict[str, TensorDataset], list[str], Split]


def shapes_splits(data: Data, cache_dir: Path) -> Splits:
    """The generated shapes, each split from its own seed (``split_seed`` * 3 + the split's index),
    cached per recipe."""
    shapes, n, seed = data.shapes, data.num_points, data.split_seed
    params = {k: v for k, v in shapes.model_dump().items() if not k.endswith("_per_class")}
    splits, members = {}, {}
    for index, split in enumerate(SPLITS):
        count = getattr(shapes, f"{split}_per_class")
        key = short_hash([params, count, n, seed, split])
        # Splits draw from distinct seeds, so no test shape is a copy of a training shape.
        build = partial(generate_shapes, count, n, seed * len(SPLITS) + index, shapes)
        points, labels = cached(cache_dir / f"pointcloud-shapes-{split}-{key}.pt", build)
        splits[split] = TensorDataset(normalise_unit_sphere(points), labels)
        members[split] = [f"shapes-{split}-{key}/{i}" for i in range(len(labels))]
    rule = f"generated, each split from its own seed: 3 x split seed {seed} + 0, 1, 2 for train, val, test"
    return splits, list(SHAPES), Split("random", rule, members)


def _modelnet_split(name: str) -> str | None:
    """``train`` or ``test`` for ``<class>/<split>/.../file``, else None."""
    folders = name.split("/")[1:-1]
    return next((split for split in ("train", "test") if split in folders), None)


def modelnet_splits(data: Data, cache_dir: Path) -> Splits:
    """ModelNet's ``<class>/{train,test}/*.off``: the folders say which clouds are test."""
    root = _root(data)
    files, classes = class_folder_files(root, MESH_EXTENSIONS + POINT_EXTENSIONS)
    if not {"train", "test"} <= {_modelnet_split(name) for name in named(files, root)}:
        raise DataError(f"{root} is not in ModelNet layout <class>/{{train,test}}/*.off")
    clouds, row = _sampled(data, cache_dir, root, files)
    members = {split: [name for name in row if _modelnet_split(name) == split] for split in ("train", "test")}
    shipped = Split("shipped", "ModelNet <class>/train/ and <class>/test/ folders", {**members, "val": []})
    split = carve_validation(shipped, data.val_fraction, data.split_seed, grouping(data))
    return _datasets(clouds, row, split), classes, split


def folder_splits(data: Data, cache_dir: Path) -> Splits:
    """Any class-per-folder tree: split folders used as shipped, or a ``test_fraction`` of the files held
    out (at random, or grouped by ``group_pattern``, from ``split_seed``); validation is a ``val_fraction``
    of the training files."""
    root, seed, groups, share = _root(data), data.split_seed, grouping(data), data.val_fraction
    if split_folders(root):
        found, classes = class_folder_splits(root, MESH_EXTENSIONS + POINT_EXTENSIONS)
        clouds, row = _sampled(data, cache_dir, root, [item for items in found.values() for item in items])
        members = {split: [name for name in named(items, root) if name in row] for split, items in found.items()}
        split = shipped_split(members, None, (1 - share, share, 0.0), seed, groups)
    else:
        files, classes = class_folder_files(root, MESH_EXTENSIONS + POINT_EXTENSIONS)
        clouds, row = _sampled(data, cache_dir, root, files)
        held_out = split_names(list(row), (1 - data.test_fraction, 0.0, data.test_fraction), seed, groups and groups.test_only())
        split = carve_validation(held_out, share, seed, groups)
    return _datasets(clouds, row, split), classes, split


def _root(data: Data) -> Path:
    """The root of a modelnet or folder tree."""
    return data_root(data, "a folder of class folders (ModelNet10/40 unzipped works as is)", folder=True)


def _sampled(data: Data, cache_dir: Path, root: Path, files: list[tuple[Path, int]]) -> tuple[dict, dict[str, int]]:
    """The tree's files sampled once (cached), and the row of each readable file's cloud by its path
    relative to the root; unreadable files are reported and left out."""
    listing = [(str(p.relative_to(root)), p.stat().st_size, label) for p, label in files]
    key = short_hash([str(root.resolve()), data.num_points, listing])
    clouds = cached(cache_dir / f"pointcloud-{root.resolve().name}-{key}.pt",
                    lambda: sample_files(files, data.num_points))
    if clouds["skipped"]:
        log.warning("%d unreadable or empty files skipped under %s, e.g. %s", len(clouds["skipped"]), root,
                    clouds["skipped"][0])
    names = list(named(files, root))
    return clouds, {names[index]: row for row, index in enumerate(clouds["kept"])}


def _datasets(clouds: dict, row: dict[str, int], split: Split) -> dict[str, TensorDataset]:
    """Each split's clouds, as ``split`` names them."""
    rows = {name: torch.tensor([row[member] for member in split.members[name]], dtype=torch.long) for name in SPLITS}
    return {name: TensorDataset(clouds["points"][idx], clouds["labels"][idx]) for name, idx in rows.items()}


# --- datamodule ----------------------------------------------------------------------------------

class PointCloudDataModule(SplitDataModule):
    """Batches ``(points [B, N, 3], labels [B])``. ``data`` is the domain config's typed ``data`` section;
    the clouds are generated or sampled (or read from the cache) on construction, from ``data`` alone."""

    def __init__(self, data: Data, cache_dir: str | Path):
        super().__init__(data.batch_size, num_workers=data.num_workers)
        self.augment = data.augment
        self.datasets, self.classes, split = LOADERS[data.dataset](data, Path(cache_dir))
        self.describe_split(*split)

    def augment_batch(self, batch):
        points, labels = batch
        aug = self.augment
        points = scale_shift(points, tuple(aug.scale), aug.shift)
        points = jitter(points, aug.jitter_sigma, aug.jitter_clip)
        ratio = aug.dropout_max * torch.rand(points.shape[0], device=points.device)
        return drop_points(points, ratio), labels


# data.dataset -> its loader (config.DATASETS names them)
LOADERS = {"shapes": shapes_splits, "modelnet": modelnet_splits, "folder": folder_splits}
