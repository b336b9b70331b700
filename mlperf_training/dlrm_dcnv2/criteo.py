"""Published facts about the MLPerf DLRM-DCNv2 dataset (Criteo 1TB click logs, synthetic multi-hot).

From the MLCommons reference (recommendation_v2/torchrec_dlrm): 24 days, days 0..22 train, day 23
split into validation (first half, rounded up) and test (the rest); 13 dense features stored as
log(x + 3) float32; 26 categorical features materialized as fixed-size multi-hot bags of int32 ids.
"""
from __future__ import annotations

DAYS = 24
NUM_DENSE = 13
NUM_SPARSE = 26

#: ids per sample of each categorical feature (``--multi_hot_sizes`` of the reference)
MULTI_HOT_SIZES: tuple[int, ...] = (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3,
                                    1, 1)

#: rows of each embedding table (``--num_embeddings_per_feature`` of the reference run)
CARDINALITIES: tuple[int, ...] = (40_000_000, 39_060, 17_295, 7_424, 20_265, 3, 7_122, 1_543, 63, 40_000_000,
                                  3_067_956, 405_282, 10, 2_209, 11_938, 155, 4, 976, 14, 40_000_000,
                                  40_000_000, 40_000_000, 590_152, 12_973, 108, 36)

#: validation samples of the real dataset (ruleset 5.1.0 closed division pins eval_samples to it)
EVAL_SAMPLES = 89_137_319

assert len(MULTI_HOT_SIZES) == len(CARDINALITIES) == NUM_SPARSE


def dense_name(day: int) -> str:
    return f"day_{day}_dense.npy"


def labels_name(day: int) -> str:
    return f"day_{day}_labels.npy"


def sparse_name(day: int) -> str:
    return f"day_{day}_sparse_multi_hot.npz"


def day_files(day: int) -> tuple[str, str, str]:
    """The three files of one day: dense, labels, sparse multi-hot."""
    return dense_name(day), labels_name(day), sparse_name(day)
