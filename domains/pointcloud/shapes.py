"""Procedurally generated labelled shapes: open3d mesh primitives under random non-uniform scaling and
rotation, sampled to points with open3d (uniform or Poisson-disk), optionally cropped by a random plane
(a partial scan) and perturbed by Gaussian noise. Deterministic for a given seed."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from scipy.spatial.transform import Rotation

from common.optional import require

from .config import Shapes

o3d = require("open3d", extra="pointcloud")
Mesh = o3d.geometry.TriangleMesh


def _capsule(rng: np.random.Generator) -> Mesh:
    # A sphere whose two hemispheres are pushed apart along z: the stretched equator band is the
    # cylinder, so the surface has no hidden inner faces for the sampler to land on.
    mesh = Mesh.create_sphere(radius=1.0, resolution=20)
    vertices = np.asarray(mesh.vertices)
    vertices[:, 2] += np.sign(vertices[:, 2]) * rng.uniform(0.5, 1.5)
    mesh.vertices = o3d.utility.Vector3dVector(vertices)
    return mesh


# Each maker draws its own proportions, so a class is a family of shapes rather than one template.
SHAPES: dict[str, Callable[[np.random.Generator], Mesh]] = {
    "box": lambda rng: Mesh.create_box(*rng.uniform(0.5, 1.5, 3)),
    "sphere": lambda rng: Mesh.create_sphere(radius=1.0, resolution=20),
    "cylinder": lambda rng: Mesh.create_cylinder(radius=1.0, height=rng.uniform(1.0, 3.0)),
    "cone": lambda rng: Mesh.create_cone(radius=1.0, height=rng.uniform(1.0, 3.0)),
    "torus": lambda rng: Mesh.create_torus(torus_radius=1.0, tube_radius=rng.uniform(0.2, 0.5)),
    "capsule": _capsule,
    "tetrahedron": lambda rng: Mesh.create_tetrahedron(),
    "octahedron": lambda rng: Mesh.create_octahedron(),
    "icosahedron": lambda rng: Mesh.create_icosahedron(),
    "arrow": lambda rng: Mesh.create_arrow(cylinder_radius=rng.uniform(0.5, 1.0), cone_radius=1.5,
                                           cylinder_height=rng.uniform(3.0, 6.0), cone_height=rng.uniform(2.0, 4.0)),
    "mobius": lambda rng: Mesh.create_mobius(twists=int(rng.integers(1, 4)), width=rng.uniform(0.5, 1.0)),
}


def random_shape(label: int, rng: np.random.Generator, num_points: int, cfg: Shapes) -> np.ndarray:
    """One sample of class ``SHAPES[label]`` as [num_points, 3]; ``cfg`` is the config's ``data.shapes`` (its
    scale, rotation, crop_prob, crop_keep, poisson_prob and noise)."""
    mesh = list(SHAPES.values())[label](rng)
    mesh.translate(-mesh.get_center())
    if cfg.rotation == "full":
        rotation = Rotation.random(random_state=rng)
    else:  # z: upright shapes turned about the vertical, as ModelNet's objects are
        rotation = Rotation.from_euler("z", rng.uniform(0, 2 * np.pi))
    transform = np.eye(4)
    transform[:3, :3] = rotation.as_matrix() @ np.diag(rng.uniform(*cfg.scale, size=3))
    mesh.transform(transform)

    keep = rng.uniform(*cfg.crop_keep) if rng.random() < cfg.crop_prob else 1.0
    total = int(np.ceil(num_points / keep))
    if rng.random() < cfg.poisson_prob:
        cloud = mesh.sample_points_poisson_disk(total)
    else:
        cloud = mesh.sample_points_uniformly(total)
    points = np.asarray(cloud.points)
    if keep < 1.0:  # a partial view: keep the points on one side of a random plane
        direction = rng.normal(size=3)
        points = points[np.argsort(points @ direction)[:num_points]]
    points = points[:num_points]
    scale = np.linalg.norm(points - points.mean(0), axis=1).max()
    return (points + rng.normal(scale=cfg.noise * scale, size=points.shape)).astype(np.float32)


def generate_shapes(count_per_class: int, num_points: int, seed: int, cfg: Shapes) -> tuple[torch.Tensor, torch.Tensor]:
    """``count_per_class`` samples of every class: points [C * count, num_points, 3] and labels."""
    rng = np.random.default_rng(seed)
    o3d.utility.random.seed(seed)  # open3d's samplers draw from their own global generator
    labels = np.repeat(np.arange(len(SHAPES)), count_per_class)
    points = np.stack([random_shape(int(label), rng, num_points, cfg) for label in labels])
    return torch.from_numpy(points), torch.from_numpy(labels)
