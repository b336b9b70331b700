"""Synthetic DeepCAM samples in the real on-disk layout, with planted, labelled weather features.

Each sample is a lat/lon grid with the 16 channels of the CAM5 dataset: smooth, spatially correlated
backgrounds with a latitude climatology (moist warm tropics, jets), plus

* tropical cyclones (label 1): compact vortices in the tropics/subtropics with a Gaussian sea-level
  pressure low, cyclonic winds peaking near the edge (counter-clockwise in the north), and a
  moisture / precipitation maximum; labelled where the pressure anomaly exceeds 1/e of its depth;
* atmospheric rivers (label 2): long narrow curved bands of integrated water vapour with winds along
  the band, running poleward-east from the subtropics; labelled where the band's moisture anomaly
  exceeds 1/e of its peak.

Feature sizes scale with the grid width, so the class frequencies (background about 98%) stay
realistic at every resolution.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CHANNELS = ("TMQ", "U850", "V850", "UBOT", "VBOT", "QREFHT", "PS", "PSL",
            "T200", "T500", "PRECT", "TS", "TREFHT", "Z1000", "Z200", "ZBOT")
C = {name: i for i, name in enumerate(CHANNELS)}


@dataclass(frozen=True)
class FeatureSpec:
    cyclones_mean: float = 1.2  # Poisson mean per sample
    rivers_mean: float = 1.4
    cyclone_radius: tuple[float, float] = (0.022, 0.036)  # of the grid width
    river_halfwidth: tuple[float, float] = (0.014, 0.022)
    river_length: tuple[float, float] = (0.2, 0.34)


def smooth_noise(rng: np.random.Generator, h: int, w: int, n: int, corr: float) -> np.ndarray:
    """(n, h, w) unit-variance Gaussian random fields with correlation length ``corr`` pixels."""
    ky = np.fft.fftfreq(h)[:, None]
    kx = np.fft.rfftfreq(w)[None, :]
    spectrum = np.exp(-2.0 * (np.pi * corr) ** 2 * (kx**2 + ky**2))
    white = rng.standard_normal((n, h, w), dtype=np.float32)
    fields = np.fft.irfft2(np.fft.rfft2(white) * spectrum, s=(h, w)).astype(np.float32)
    fields /= fields.std(axis=(1, 2), keepdims=True) + 1e-12
    return fields


def background(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """(16, h, w) climatology + correlated weather noise."""
    lat = np.linspace(-np.pi / 2, np.pi / 2, h, dtype=np.float32)[:, None] * np.ones((1, w), np.float32)
    cos2 = np.cos(lat) ** 2
    n = smooth_noise(rng, h, w, 6, corr=w / 24)
    f = np.empty((len(CHANNELS), h, w), np.float32)
    f[C["TMQ"]] = 4 + 40 * cos2**2 + 2.5 * n[0]
    f[C["U850"]] = 12 * np.sin(2 * np.abs(lat)) * (1 - 1.5 * cos2**3) + 4 * n[1]
    f[C["V850"]] = 4 * n[2]
    f[C["UBOT"]] = 0.7 * f[C["U850"]] + 1.0 * n[3]
    f[C["VBOT"]] = 0.7 * f[C["V850"]] - 1.0 * n[3]
    f[C["QREFHT"]] = 0.002 + 0.016 * cos2**2 + 0.001 * n[0]
    f[C["PSL"]] = 101300 - 600 * cos2 * np.cos(3 * lat) + 500 * n[4]
    f[C["PS"]] = f[C["PSL"]] - 900 - 400 * np.abs(n[5])
    f[C["T200"]] = 212 + 8 * cos2 + 1.5 * n[1]
    f[C["T500"]] = 243 + 22 * cos2 + 2 * n[4]
    f[C["PRECT"]] = 2e-8 * np.exp(1.2 * n[0]) * (0.3 + cos2)
    f[C["TS"]] = 245 + 55 * cos2 + 3 * n[5]
    f[C["TREFHT"]] = f[C["TS"]] - 1.5 - 0.5 * np.abs(n[2])
    f[C["Z1000"]] = (f[C["PSL"]] - 100000) / 12.0
    f[C["Z200"]] = 11300 + 900 * cos2 + 60 * n[4]
    f[C["ZBOT"]] = 62 + 3 * n[5]
    return f


def add_cyclone(f: np.ndarray, labels: np.ndarray, rng: np.random.Generator, spec: FeatureSpec) -> None:
    _, h, w = f.shape
    r0 = rng.uniform(*spec.cyclone_radius) * w
    north = rng.random() < 0.5
    lat_deg = rng.uniform(8, 32) * (1 if north else -1)
    cy = (lat_deg + 90) / 180 * (h - 1)
    cx = rng.uniform(r0 * 2, w - r0 * 2)
    y0, y1 = max(0, int(cy - 4 * r0)), min(h, int(cy + 4 * r0) + 1)
    x0, x1 = max(0, int(cx - 4 * r0)), min(w, int(cx + 4 * r0) + 1)
    yy, xx = np.mgrid[y0:y1, x0:x1].astype(np.float32)
    dy, dx = yy - cy, xx - cx
    r = np.hypot(dy, dx) / r0
    bump = np.exp(-(r**2))
    depth = rng.uniform(2500, 6000)
    vmax = rng.uniform(25, 55) * (1 if north else -1)
    vt = vmax * r * np.exp(0.5 * (1 - r**2))  # tangential wind, peak at r = r0
    rr = np.maximum(np.hypot(dy, dx), 1e-3)
    u, v = -vt * dy / rr, vt * dx / rr  # array row grows northward: counter-clockwise when north
    win = (slice(y0, y1), slice(x0, x1))
    f[(C["PSL"], *win)] -= depth * bump
    f[(C["PS"], *win)] -= depth * bump
    f[(C["Z1000"], *win)] -= depth * bump / 12.0
    f[(C["U850"], *win)] += u
    f[(C["V850"], *win)] += v
    f[(C["UBOT"], *win)] += 0.8 * u
    f[(C["VBOT"], *win)] += 0.8 * v
    f[(C["TMQ"], *win)] += rng.uniform(15, 30) * bump
    f[(C["QREFHT"], *win)] += 0.004 * bump
    f[(C["PRECT"], *win)] += 4e-7 * bump
    f[(C["T200"], *win)] += 4 * bump  # warm core aloft
    f[(C["T500"], *win)] += 3 * bump
    labels[win][bump > np.exp(-1.0)] = 1


def add_river(f: np.ndarray, labels: np.ndarray, rng: np.random.Generator, spec: FeatureSpec) -> None:
    _, h, w = f.shape
    half = rng.uniform(*spec.river_halfwidth) * w
    length = rng.uniform(*spec.river_length) * w
    north = rng.random() < 0.5
    lat_deg = rng.uniform(18, 32) * (1 if north else -1)
    p0 = np.array([(lat_deg + 90) / 180 * (h - 1), rng.uniform(0.05, 0.6) * w])
    angle = np.deg2rad(rng.uniform(20, 55)) * (1 if north else -1)
    d = np.array([np.sin(angle), np.cos(angle)])  # (dy, dx): east and poleward
    nrm = np.array([d[1], -d[0]])
    bend = rng.uniform(-0.25, 0.25) * length
    t = np.linspace(0, 1, max(16, int(3 * length / half)))  # spacing ~half/3: exact enough
    pts = p0 + np.outer(t * length, d) + np.outer(4 * t * (1 - t) * bend, nrm)  # (n, 2)
    lo = np.floor(pts.min(0) - 3 * half).astype(int)
    hi = np.ceil(pts.max(0) + 3 * half).astype(int) + 1
    y0, x0 = max(0, lo[0]), max(0, lo[1])
    y1, x1 = min(h, hi[0]), min(w, hi[1])
    if y1 <= y0 or x1 <= x0:
        return
    yy, xx = np.mgrid[y0:y1, x0:x1].astype(np.float32)
    dist2 = (yy[..., None] - pts[:, 0]) ** 2 + (xx[..., None] - pts[:, 1]) ** 2
    k = dist2.argmin(-1)
    taper = np.sin(np.pi * t[k]) ** 0.5  # band fades out at both ends
    band = np.exp(-np.take_along_axis(dist2, k[..., None], -1)[..., 0] / half**2) * taper
    tangent = np.gradient(pts, axis=0)[k]
    tangent /= np.linalg.norm(tangent, axis=-1, keepdims=True)
    speed = rng.uniform(12, 25) * band
    win = (slice(y0, y1), slice(x0, x1))
    f[(C["TMQ"], *win)] += rng.uniform(18, 28) * band
    f[(C["QREFHT"], *win)] += 0.003 * band
    f[(C["PRECT"], *win)] += 1.5e-7 * band
    f[(C["U850"], *win)] += speed * tangent[..., 1]
    f[(C["V850"], *win)] += speed * tangent[..., 0]
    f[(C["UBOT"], *win)] += 0.6 * speed * tangent[..., 1]
    f[(C["VBOT"], *win)] += 0.6 * speed * tangent[..., 0]
    region = labels[win]
    region[(band > np.exp(-1.0)) & (region == 0)] = 2


def make_sample(seed: tuple[int, ...], h: int, w: int, spec: FeatureSpec = FeatureSpec()) -> tuple[np.ndarray, np.ndarray]:
    """(data (h, w, 16) float32 HWC as stored on disk, labels (h, w) uint8) for one seed."""
    rng = np.random.default_rng(seed)
    f = background(rng, h, w)
    labels = np.zeros((h, w), np.uint8)
    for _ in range(rng.poisson(spec.cyclones_mean)):
        add_cyclone(f, labels, rng, spec)
    for _ in range(rng.poisson(spec.rivers_mean)):
        add_river(f, labels, rng, spec)
    for name in ("TMQ", "QREFHT", "PRECT"):  # amounts of water are never negative
        np.maximum(f[C[name]], 0.0, out=f[C[name]])
    return np.ascontiguousarray(f.transpose(1, 2, 0)), labels
