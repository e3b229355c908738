"""Point-cloud classification data: generated shapes (default), ModelNet10/40 in its original
``<class>/{train,test}/*.off`` layout, or any class-per-folder tree of meshes or point files, all read
and sampled with open3d, normalised to the unit sphere and cached as [M, num_points, 3] tensors.
Training batches are augmented on the device (scale/shift, jitter, point dropout)."""
from __future__ import annotations

import hashlib
import logging
import tempfile
from functools import partial
from pathlib import Path

import numpy as np
import open3d as o3d
import torch
from omegaconf import OmegaConf
from torch import Tensor
from torch.utils.data import TensorDataset

from common.data import DataError, SplitDataModule, cached, class_folder_files, seeded_split

from .shapes import SHAPES, generate_shapes

log = logging.getLogger(__name__)

MESH_EXTENSIONS = (".off", ".obj", ".ply", ".stl")
POINT_EXTENSIONS = (".pcd", ".xyz", ".xyzn", ".xyzrgb", ".pts")
# Meshes are sampled once for every run that shares the cache, so their sampling seed is fixed.
SAMPLING_SEED = 0


# --- reading -------------------------------------------------------------------------------------

def _read_mesh(path: Path) -> o3d.geometry.TriangleMesh:
    mesh = o3d.io.read_triangle_mesh(str(path))
    if not mesh.has_triangles() and path.suffix.lower() == ".off":
        # Many ModelNet files fuse the header with the counts ("OFF490 518 0"), which open3d rejects.
        text = path.read_text(errors="replace")
        if text.startswith("OFF") and not text[3:4].isspace():
            with tempfile.NamedTemporaryFile("w", suffix=".off") as fixed:
                fixed.write("OFF\n" + text[3:])
                fixed.flush()
                mesh = o3d.io.read_triangle_mesh(fixed.name)
    return mesh


def read_points(path: Path, num_points: int, rng: np.random.Generator) -> np.ndarray:
    """``num_points`` points from a mesh (uniform surface samples) or a point file (farthest-point
    subset, or resampled with repetition when it has fewer). An unreadable or empty file is a DataError."""
    with o3d.utility.VerbosityContextManager(o3d.utility.VerbosityLevel.Error):
        mesh = _read_mesh(path) if path.suffix.lower() in MESH_EXTENSIONS else None
        if mesh is not None and mesh.has_triangles():
            return np.asarray(mesh.sample_points_uniformly(num_points).points, dtype=np.float32)
        cloud = o3d.io.read_point_cloud(str(path))  # point files, and PLY files without faces
    if not cloud.has_points():
        raise DataError(f"{path}: unreadable or empty mesh/point file")
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
    """Every file sampled to ``num_points``; unreadable ones are reported by path, skipped and counted.
    ``kept`` lists the indices into ``files`` of the clouds returned."""
    rng = np.random.default_rng(SAMPLING_SEED)
    o3d.utility.random.seed(SAMPLING_SEED)
    points, labels, kept, skipped = [], [], [], []
    for index, (path, label) in enumerate(files):
        try:
            points.append(read_points(path, num_points, rng))
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


# --- datamodule ----------------------------------------------------------------------------------

class PointCloudDataModule(SplitDataModule):
    """Batches ``(points [B, N, 3], labels [B])``. ``cfg`` is the ``data`` section of the domain YAML."""

    def __init__(self, cfg, cache_dir: str | Path, seed: int):
        super().__init__(cfg.batch_size, num_workers=cfg.num_workers)
        self.cfg, self.cache_dir, self.seed = cfg, Path(cache_dir), seed
        if cfg.dataset == "shapes":
            self.classes = list(SHAPES)
        elif cfg.dataset in ("modelnet", "folder"):
            if cfg.root is None or not Path(cfg.root).expanduser().exists():
                raise DataError(f"dataset {cfg.dataset!r} needs data.root, an existing folder of class folders "
                                f"(got {cfg.root}); ModelNet10/40 unzipped from modelnet.cs.princeton.edu works as is")
            self.root = Path(cfg.root).expanduser()
            self.files, self.classes = class_folder_files(self.root, MESH_EXTENSIONS + POINT_EXTENSIONS)
            found = {self._modelnet_split(path) for path, _ in self.files}
            if cfg.dataset == "modelnet" and not {"train", "test"} <= found:
                raise DataError(f"{self.root} is not in ModelNet layout <class>/{{train,test}}/*.off")
        else:
            raise DataError(f"unknown pointcloud dataset {cfg.dataset!r}; choose shapes, modelnet or folder")
        self.skipped: list[str] = []

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def setup(self, stage: str | None = None) -> None:
        if not self.datasets:
            self.datasets = self._shapes() if self.cfg.dataset == "shapes" else self._tree()

    def _shapes(self) -> dict[str, TensorDataset]:
        shapes, n = self.cfg.shapes, self.cfg.num_points
        counts = {"train": shapes.train_per_class, "val": shapes.val_per_class, "test": shapes.test_per_class}
        params = {k: v for k, v in OmegaConf.to_container(shapes).items() if not k.endswith("_per_class")}
        splits = {}
        for index, (split, count) in enumerate(counts.items()):
            key = hashlib.sha1(repr((sorted(params.items()), count, n, self.seed, split)).encode()).hexdigest()[:12]
            # Splits draw from distinct seeds, so no test shape is a copy of a training shape.
            build = partial(generate_shapes, count, n, self.seed * len(counts) + index, shapes)
            points, labels = cached(self.cache_dir / f"pointcloud-shapes-{split}-{key}.pt", build)
            splits[split] = TensorDataset(normalise_unit_sphere(points), labels)
        return splits

    def _tree(self) -> dict[str, TensorDataset]:
        root = self.root
        listing = [(str(p.relative_to(root)), p.stat().st_size, label) for p, label in self.files]
        key = hashlib.sha1(repr((str(root.resolve()), self.cfg.num_points, listing)).encode()).hexdigest()[:12]
        data = cached(self.cache_dir / f"pointcloud-{root.resolve().name}-{key}.pt",
                      lambda: sample_files(self.files, self.cfg.num_points))
        self.skipped = data["skipped"]
        if self.skipped:
            log.warning("%d unreadable or empty files skipped under %s, e.g. %s", len(self.skipped), root,
                        self.skipped[0])
        test, train = self._split_test([self.files[i][0] for i in data["kept"]])
        # Model selection never looks at test: validation comes out of the training files.
        fraction = self.cfg.val_fraction
        fit, _, val = seeded_split(len(train), (1 - fraction, 0.0, fraction), self.cfg.split_seed)
        parts = {"train": train[fit], "val": train[val], "test": test}
        return {split: TensorDataset(data["points"][idx], data["labels"][idx]) for split, idx in parts.items()}

    def _modelnet_split(self, path: Path) -> str | None:
        """``train`` or ``test`` for ``<class>/<split>/.../file``, else None."""
        folders = path.relative_to(self.root).parts[1:-1]
        return next((split for split in ("train", "test") if split in folders), None)

    def _split_test(self, paths: list[Path]) -> tuple[Tensor, Tensor]:
        """Indices of the test and training clouds: by the ``train``/``test`` folders of the ModelNet
        layout, or a seeded random split of a plain class-per-folder tree."""
        if self.cfg.dataset == "modelnet":
            splits = [self._modelnet_split(path) for path in paths]
            return (torch.tensor([i for i, s in enumerate(splits) if s == "test"], dtype=torch.long),
                    torch.tensor([i for i, s in enumerate(splits) if s == "train"], dtype=torch.long))
        fraction = self.cfg.test_fraction
        train, _, test = seeded_split(len(paths), (1 - fraction, 0.0, fraction), self.cfg.split_seed)
        return torch.tensor(test, dtype=torch.long), torch.tensor(train, dtype=torch.long)

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        if self.trainer is None or not self.trainer.training:
            return batch
        points, labels = batch
        aug = self.cfg.augment
        points = scale_shift(points, tuple(aug.scale), aug.shift)
        points = jitter(points, aug.jitter_sigma, aug.jitter_clip)
        ratio = aug.dropout_max * torch.rand(points.shape[0], device=points.device)
        return drop_points(points, ratio), labels
